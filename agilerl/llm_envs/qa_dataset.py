"""Dataset-backed envs."""

from agilerl.data.dataset_env import DatasetEnv
from agilerl.data.qa_dataset import QADatasetEnv

__all__ = ["DatasetEnv", "QADatasetEnv"]
