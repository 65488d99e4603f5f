"""Off-policy corrections: the sampler's tokens reweighed toward the policy being trained.

The log-probs the sampler reported (``RolloutTensors.old_logprobs``: vLLM's kernels, another
precision, or in async training weights up to ``max_staleness`` steps older) differ from those the
trainer recomputes. The built-in algorithms take their clipped ratio against the trainer's own
recomputed log-probs and correct the gap to the sampler separately, per token, with
``w = pi_trainer / pi_sampler`` (decoupled PPO, AReaL; truncated importance sampling, Yao et al.):

- ``importance_cap``: truncated importance sampling: ``min(w, cap)``, a constant (no gradient)
  multiplying each token's advantage; ``importance_level: sequence`` uses the rollout's geometric
  mean ``w`` for all its tokens;
- ``token_mask_low/high``: a token whose ``w`` lies outside the bounds leaves the loss;
- ``sequence_mask_low/high``: a rollout whose geometric-mean ``w`` lies outside them leaves it whole.

At ``w == 1`` (the sampler's log-probs are the trainer's) nothing changes: the weight is exactly
1 and the bounds must enclose 1. A batch without sampler log-probs has nothing to correct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field

from agilerl.train.algorithm import AlgorithmConfig
from agilerl.train.logprobs import masked_mean

__all__ = ["OffPolicyConfig", "Correction", "off_policy_correction", "mask_bound", "level_field"]


def mask_bound(default: float | None, side: Literal["low", "high"], unit: Literal["token", "rollout"]) -> Any:
    """The field of one mask bound (an algorithm's config changes its default with it): a low
    bound in [0, 1], a high one >= 1, so that ratio 1 (on-policy) is never masked."""
    ratio = "geometric-mean ratio" if unit == "rollout" else "ratio"
    where = "below" if side == "low" else "above"
    limits = {"ge": 0, "le": 1} if side == "low" else {"ge": 1}
    return Field(
        default, **limits, description=f"A {unit} whose {ratio} is {where} this leaves the loss (null: no bound)."
    )


def level_field(default: Literal["token", "sequence"]) -> Any:
    """The field of ``importance_level`` (an algorithm's config changes its default with it)."""
    return Field(
        default,
        description="'token': each token its own weight; 'sequence': the rollout's geometric-mean "
        "weight on every token of it (no weight with importance_cap null).",
    )


class OffPolicyConfig(AlgorithmConfig):
    """The correction's options (every rollout algorithm takes them; defaults per algorithm)."""

    importance_cap: float | None = Field(
        2.0,
        ge=1,
        description="Truncated importance sampling: each token's weight pi_trainer/pi_sampler is "
        "capped here (null: no weight, the masks alone).",
    )
    importance_level: Literal["token", "sequence"] = level_field("token")
    token_mask_low: float | None = mask_bound(0.125, "low", "token")
    token_mask_high: float | None = mask_bound(8.0, "high", "token")
    sequence_mask_low: float | None = mask_bound(0.1, "low", "rollout")
    sequence_mask_high: float | None = mask_bound(10.0, "high", "rollout")


@dataclass(frozen=True)
class Correction:
    """What the loss applies: ``mask`` (the loss mask less the rejected tokens) and ``weight``
    (``[B, T]``, no gradient; None: 1 everywhere), with the metrics that describe the gap."""

    mask: torch.Tensor
    weight: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def weigh(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (advantages) times the weight; the same tensor when there is none."""
        return values if self.weight is None else values * self.weight


def off_policy_correction(
    trainer: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor, config: OffPolicyConfig
) -> Correction:
    """The correction of ``sampler``'s tokens toward ``trainer`` (both ``[B, T]`` log-probs, the
    trainer's detached), on the tokens of ``mask``; nothing to correct without ``sampler``."""
    if sampler is None:
        return Correction(mask)
    with torch.no_grad():
        log_ratio = torch.where(mask, trainer.float() - sampler.float(), 0.0)
        ratio = torch.exp(log_ratio)
        weights = mask.float()
        tokens = weights.sum(dim=1)
        sequence_log_ratio = log_ratio.sum(dim=1) / tokens.clamp(min=1.0)  # log of the geometric mean
        keep = _inside(ratio, config.token_mask_low, config.token_mask_high)
        kept_rows = _inside(torch.exp(sequence_log_ratio), config.sequence_mask_low, config.sequence_mask_high)
        kept = mask & keep & kept_rows[:, None]
        weight = None
        if config.importance_cap is not None:
            log_cap = math.log(config.importance_cap)
            if config.importance_level == "sequence":
                weight = torch.exp(sequence_log_ratio.clamp(max=log_cap))[:, None].expand_as(log_ratio)
                truncated = (sequence_log_ratio > log_cap)[:, None].expand_as(mask)
            else:
                weight = torch.exp(log_ratio.clamp(max=log_cap))
                truncated = log_ratio > log_cap
        rows = tokens > 0
        metrics = {
            "sampler_kl": masked_mean(ratio - log_ratio - 1, mask).item(),  # k3 of KL(sampler || trainer)
            "token_masked_fraction": masked_mean((~keep).float(), mask).item(),
            "sequence_masked_fraction": masked_mean((~kept_rows).float(), rows).item(),
        }
        if weight is not None:
            metrics["importance_weight_mean"] = masked_mean(weight, kept).item()
            metrics["importance_truncated_fraction"] = masked_mean(truncated.float(), mask).item()
    return Correction(kept, weight, metrics)


def _inside(values: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """Where ``low <= values <= high`` (a None bound holds everywhere)."""
    inside = torch.ones_like(values, dtype=torch.bool)
    if low is not None:
        inside &= values >= low
    if high is not None:
        inside &= values <= high
    return inside
