"""LLMREINFORCE: the plain policy gradient with discounted returns and a group baseline."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from agilerl.builtins.algorithms.advantages import (
    discounted_returns,
    leave_one_out_mean,
    per_turn_to_tokens,
    rewards_at_turn_ends,
    turn_action_bounds,
)
from agilerl.builtins.algorithms.off_policy import Correction
from agilerl.builtins.algorithms.policy_gradient import PolicyGradient, TurnOrTokenConfig
from agilerl.train.batch import RolloutTensors
from agilerl.train.logprobs import masked_mean

__all__ = ["LLMREINFORCEConfig", "LLMREINFORCE"]


class LLMREINFORCEConfig(TurnOrTokenConfig):
    """REINFORCE's options."""

    baseline: Literal["leave_one_out", "none"] = Field(
        "leave_one_out",
        description=(
            "'leave_one_out': subtract the mean return of the other members of the group "
            "(unbiased; 0 for a group of one); 'none': raw returns."
        ),
    )


class LLMREINFORCE(PolicyGradient[LLMREINFORCEConfig]):
    """REINFORCE: ``-(G - b) log p`` averaged over action tokens; no ratio of its own (the
    off-policy correction's weight is the importance weight)."""

    config_class = LLMREINFORCEConfig

    def policy_loss(
        self, logprobs: torch.Tensor, outputs: Any, batch: RolloutTensors, correction: Correction
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask
        granularity = self.config.granularity_for(batch)
        returns, episode_return = self.returns(batch, granularity)
        baseline = torch.zeros_like(episode_return)
        if self.config.baseline == "leave_one_out":
            baseline = leave_one_out_mean(episode_return, batch.group)
        advantages = (returns - baseline[:, None]) * mask
        loss = -masked_mean(correction.weigh(advantages) * logprobs, correction.mask)
        return loss, {
            "advantage_abs_mean": masked_mean(advantages.abs(), mask).item(),
            "turn_level": float(granularity == "turn"),
        }

    def returns(
        self, batch: RolloutTensors, granularity: Literal["turn", "token"]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token returns ``[B, T]`` and each rollout's return from its first step ``[B]``."""
        gamma = self.config.gamma
        if granularity == "turn":
            per_turn = discounted_returns(batch.turn_rewards, batch.turn_mask, gamma)
            return per_turn_to_tokens(per_turn, batch.turn_ids), per_turn[:, 0]
        per_token = discounted_returns(rewards_at_turn_ends(batch), batch.action_mask, gamma)
        first, _ = turn_action_bounds(batch.turn_ids, batch.action_mask, batch.max_turns)
        return per_token, per_token.gather(1, first[:, :1].clamp(min=0)).squeeze(1)
