"""Dataset-backed envs: tables, prompt templates, rubrics, QADatasetEnv and DatasetEnv."""
