"""Dataset-backed envs."""

from agilerl.core.data.dataset_env import DatasetEnv
from agilerl.core.data.qa_dataset import QADatasetEnv

__all__ = ["DatasetEnv", "QADatasetEnv"]
