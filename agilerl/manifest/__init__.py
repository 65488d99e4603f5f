"""The manifest: the environment spec and the typed model/algorithm/training sections."""
