"""Our own envs, rubrics, processors and algorithms, registered through the public hooks."""
