"""GSPO (Qwen): one length-normalised importance ratio per sequence, clipped per sequence.

Implemented in the GSPO-token form: every token carries the sequence ratio's value with its own
log-prob's gradient, which equals GSPO exactly when a sequence's advantages are constant and
also admits per-turn advantages.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from agilerl.builtins.algorithms.grpo import GroupRelative, GroupRelativeConfig
from agilerl.builtins.algorithms.off_policy import level_field, mask_bound
from agilerl.builtins.algorithms.policy_gradient import clipped_surrogate
from agilerl.train.logprobs import masked_mean

__all__ = ["GSPOConfig", "GSPO"]


class GSPOConfig(GroupRelativeConfig):
    """GRPO's options with the paper's (much narrower) sequence-level clip ranges; the
    off-policy correction is per sequence too (one weight per rollout, no token masks)."""

    epsilon_low: float = Field(3e-4, ge=0, description="Lower clip range of the sequence ratio.")
    epsilon_high: float = Field(4e-4, ge=0, description="Upper clip range of the sequence ratio.")
    importance_level: Literal["token", "sequence"] = level_field("sequence")
    token_mask_low: float | None = mask_bound(None, "low", "token")
    token_mask_high: float | None = mask_bound(None, "high", "token")


class GSPO(GroupRelative[GSPOConfig]):
    """Group Sequence Policy Optimization."""

    config_class = GSPOConfig

    def surrogate(
        self, logprobs: Tensor, old: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        weights = mask.float()
        lengths = weights.sum(dim=1).clamp(min=1.0)
        sequence_ratio = torch.exp(((logprobs - old) * weights).sum(dim=1) / lengths)
        ratio = sequence_ratio.detach()[:, None] * torch.exp(logprobs - logprobs.detach())
        objective, clipped = clipped_surrogate(
            ratio, advantages, self.config.epsilon_low, self.config.epsilon_high
        )
        return objective, {"clip_fraction": masked_mean(clipped.float(), mask).item()}

    def aggregate(
        self, objective: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean over sequences of each sequence's token mean (every completion weighs the same);
        with ``weight`` (split episodes) a row weighs its share of its episode, so an episode's
        samples together weigh one completion."""
        weights = mask.float()
        tokens = weights.sum(dim=1)
        per_sequence = (objective * weights).sum(dim=1) / tokens.clamp(min=1.0)
        if weight is None:
            return masked_mean(per_sequence, tokens > 0)
        rows = weight * (tokens > 0)
        return (per_sequence * rows).sum() / rows.sum().clamp(min=1e-8)
