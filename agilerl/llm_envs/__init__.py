"""The documented import paths users write; thin, lazy re-exports of the core."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "RolloutHarness": "agilerl.core.harness",
    "InProcessEnvClient": "agilerl.core.client",
    "RemoteEnvClient": "agilerl.core.remote.client",
    "QADatasetEnv": "agilerl.core.data.qa_dataset",
    "DatasetEnv": "agilerl.core.data.dataset_env",
    "RolloutCollector": "agilerl.core.collect.collector",
    "TaskAssigner": "agilerl.core.collect.assigner",
    "train_llm_rollout": "agilerl.core.train.loops",
    "train_llm_dataset": "agilerl.core.train.loops",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agilerl.llm_envs' has no attribute {name!r}")
