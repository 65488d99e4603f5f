"""GRPO: group-relative advantages and a clipped importance ratio (DeepSeekMath).

``GroupRelative`` is the family's base: it computes advantages (per completion or per turn,
normalised within each group) and aggregates the objective; the variants (GRPO, CISPO, GSPO)
differ only in :meth:`GroupRelative.surrogate`, their treatment of the importance ratio.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal, TypeVar

import torch
from pydantic import Field, field_validator
from torch import Tensor

from agilerl.builtins.algorithms.advantages import (
    group_normalize,
    has_per_turn_rewards,
    per_episode,
    per_turn_to_tokens,
    to_rows,
)
from agilerl.builtins.algorithms.off_policy import Correction
from agilerl.builtins.algorithms.policy_gradient import (
    GRANULARITY_KEYS,
    ClippedConfig,
    PolicyGradient,
    clipped_surrogate,
)
from agilerl.train.batch import RolloutTensors
from agilerl.train.logprobs import masked_mean

__all__ = ["GroupRelativeConfig", "GroupRelative", "GRPO"]


class GroupRelativeConfig(ClippedConfig):
    """Options of GRPO, CISPO and GSPO."""

    advantage_granularity: Literal["auto", "trajectory", "turn"] = Field(
        "auto",
        validation_alias=GRANULARITY_KEYS,
        description=(
            "'trajectory': one advantage per completion (sum of its turn rewards); 'turn': each "
            "turn's reward against the group members that played that turn; 'auto': 'turn' when "
            "rewards arrive before the last turn, else 'trajectory'."
        ),
    )
    std_epsilon: float = Field(1e-4, gt=0, description="Added to the group std before dividing.")
    scale_rewards: bool = Field(
        True, description="Divide by the group std (false: mean-centred only, as in Dr. GRPO)."
    )

    @field_validator("advantage_granularity", mode="before")
    @classmethod
    def _no_token_level(cls, value: Any) -> Any:
        if value == "token":
            raise ValueError(
                "'token' is not available to group-relative algorithms (GRPO, CISPO, GSPO): they "
                "compare whole completions or turns. Use 'auto', 'trajectory' or 'turn', or choose "
                "llmppo or llmreinforce, which take 'token'."
            )
        return value


ConfigT = TypeVar("ConfigT", bound=GroupRelativeConfig)


class GroupRelative(PolicyGradient[ConfigT]):
    """Group-relative advantages; subclasses define the per-token objective in ``surrogate``."""

    config_class = GroupRelativeConfig

    def policy_loss(
        self, logprobs: torch.Tensor, outputs: Any, batch: RolloutTensors, correction: Correction
    ) -> tuple[torch.Tensor, dict[str, float]]:
        granularity = self.granularity(batch)
        advantages = self.advantages(batch, granularity)
        mask = correction.mask
        objective, metrics = self.surrogate(
            logprobs, logprobs.detach(), correction.weigh(advantages), mask
        )
        metrics["turn_level"] = float(granularity == "turn")
        metrics["advantage_abs_mean"] = masked_mean(advantages.abs(), batch.loss_mask).item()
        return -self.aggregate(objective, mask, batch.sample_weight if batch.is_split else None), metrics

    def granularity(self, batch: RolloutTensors) -> Literal["trajectory", "turn"]:
        """The configured granularity, with ``auto`` settled for this batch."""
        requested = self.config.advantage_granularity
        if requested != "auto":
            return requested
        return "turn" if has_per_turn_rewards(batch) else "trajectory"

    def advantages(
        self, batch: RolloutTensors, granularity: Literal["trajectory", "turn"]
    ) -> torch.Tensor:
        """Per-token advantages ``[B, T]`` (0 off the loss mask), normalised over the group's
        episodes (an episode split into several rows counts once) and given to each of its rows."""
        rewards = per_episode(batch.turn_rewards, batch)
        if granularity == "trajectory":
            values = rewards.sum(dim=1, keepdim=True)
            mask = torch.ones_like(values, dtype=torch.bool)
        else:
            values, mask = rewards, per_episode(batch.turn_mask, batch)
        per_turn = to_rows(
            group_normalize(
                values,
                mask,
                per_episode(batch.group, batch),
                epsilon=self.config.std_epsilon,
                scale=self.config.scale_rewards,
            ),
            batch,
        )
        if granularity == "trajectory":
            return per_turn.expand(batch.input_ids.shape) * batch.loss_mask
        return per_turn_to_tokens(per_turn, batch.turn_ids) * batch.loss_mask

    def aggregate(
        self, objective: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token-level mean over every action token in the batch (long answers weigh more).

        ``weight`` (``[B]``, with split episodes: each row's share of its episode) is not needed
        here: every generated token sits in exactly one row, so an episode weighs its tokens
        however many rows hold them. Per-row means (GSPO's) use it."""
        return masked_mean(objective, mask)

    @abstractmethod
    def surrogate(
        self, logprobs: Tensor, old: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """Per-token objective to maximise from the ratio's two sides, and its metrics."""


class GRPO(GroupRelative[GroupRelativeConfig]):
    """Group Relative Policy Optimization: the PPO-style clipped per-token ratio."""

    def surrogate(
        self, logprobs: Tensor, old: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        ratio = torch.exp(logprobs - old)
        objective, clipped = clipped_surrogate(
            ratio, advantages, self.config.epsilon_low, self.config.epsilon_high
        )
        return objective, {"clip_fraction": masked_mean(clipped.float(), mask).item()}
