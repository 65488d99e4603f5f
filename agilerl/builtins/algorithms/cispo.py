"""CISPO (MiniMax-M1): clip the importance-sampling weight, not the update.

The clipped weight is a constant (its gradient is stopped) multiplying ``log-prob * advantage``,
so every token keeps a gradient, including the rare high-ratio tokens PPO-style clipping drops.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from agilerl.builtins.algorithms.grpo import GroupRelative, GroupRelativeConfig
from agilerl.builtins.algorithms.off_policy import mask_bound
from agilerl.train.logprobs import masked_mean

__all__ = ["CISPOConfig", "CISPO"]


class CISPOConfig(GroupRelativeConfig):
    """GRPO's options; by default only the upper side of the weight is bounded, as in the paper,
    and no token is masked for its off-policy ratio (every token keeps its gradient: CISPO's
    point); whole rollouts still are, past the sequence bounds."""

    epsilon_low: float = Field(
        1.0, ge=0, description="Lower clip range of the IS weight (1: none)."
    )
    epsilon_high: float = Field(0.28, ge=0, description="Upper clip range of the IS weight.")
    token_mask_low: float | None = mask_bound(None, "low", "token")
    token_mask_high: float | None = mask_bound(None, "high", "token")


class CISPO(GroupRelative[CISPOConfig]):
    """Clipped IS-weight Policy Optimization."""

    config_class = CISPOConfig

    def surrogate(
        self, logprobs: Tensor, old: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        ratio = torch.exp(logprobs - old).detach()
        weight = ratio.clamp(1 - self.config.epsilon_low, 1 + self.config.epsilon_high)
        clipped = (weight != ratio).float()
        return weight * advantages * logprobs, {"clip_fraction": masked_mean(clipped, mask).item()}
