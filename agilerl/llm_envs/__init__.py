"""The documented import paths users write; thin, lazy re-exports of the core."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "RolloutHarness": "agilerl.rollout.harness",
    "InProcessEnvClient": "agilerl.envs.client",
    "RemoteEnvClient": "agilerl.remote.client",
    "QADatasetEnv": "agilerl.data.qa_dataset",
    "DatasetEnv": "agilerl.data.dataset_env",
    "RolloutCollector": "agilerl.rollout.collector",
    "TaskAssigner": "agilerl.rollout.assigner",
    "train_llm_rollout": "agilerl.train.loops",
    "train_llm_dataset": "agilerl.train.loops",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agilerl.llm_envs' has no attribute {name!r}")
