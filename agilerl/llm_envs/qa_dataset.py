"""Dataset-backed envs (loaded on first use: ``datasets`` is heavy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agilerl.llm_envs._lazy import lazy_exports

_LAZY = {
    "QADatasetEnv": "agilerl.data.qa_dataset",
    "DatasetEnv": "agilerl.data.dataset_env",
    "RubricError": "agilerl.errors",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

if TYPE_CHECKING:
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.data.qa_dataset import QADatasetEnv
    from agilerl.errors import RubricError
