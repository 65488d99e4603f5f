"""Training: the algorithm contract, rollout batches and token log-probs (torch loads lazily)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Algorithm": "agilerl.core.train.algorithm",
    "AlgorithmConfig": "agilerl.core.train.algorithm",
    "build_algorithm": "agilerl.core.train.algorithm",
    "RolloutTensors": "agilerl.core.train.batch",
    "collate_trajectories": "agilerl.core.train.batch",
    "masked_mean": "agilerl.core.train.logprobs",
    "policy_logprobs": "agilerl.core.train.logprobs",
    "token_logprobs": "agilerl.core.train.logprobs",
}

__all__ = list(_LAZY)

if TYPE_CHECKING:
    from agilerl.core.train.algorithm import Algorithm, AlgorithmConfig, build_algorithm
    from agilerl.core.train.batch import RolloutTensors, collate_trajectories
    from agilerl.core.train.logprobs import masked_mean, policy_logprobs, token_logprobs


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agilerl.core.train' has no attribute {name!r}")
