"""Training: the algorithm contract, rollout batches and token log-probs (torch loads lazily)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Algorithm": "agilerl.train.algorithm",
    "AlgorithmConfig": "agilerl.train.algorithm",
    "build_algorithm": "agilerl.train.algorithm",
    "RolloutTensors": "agilerl.train.batch",
    "collate_trajectories": "agilerl.train.batch",
    "masked_mean": "agilerl.train.logprobs",
    "policy_logprobs": "agilerl.train.logprobs",
    "token_logprobs": "agilerl.train.logprobs",
}

__all__ = list(_LAZY)

if TYPE_CHECKING:
    from agilerl.train.algorithm import Algorithm, AlgorithmConfig, build_algorithm
    from agilerl.train.batch import RolloutTensors, collate_trajectories
    from agilerl.train.logprobs import masked_mean, policy_logprobs, token_logprobs


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agilerl.train' has no attribute {name!r}")
