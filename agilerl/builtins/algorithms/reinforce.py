"""LLMREINFORCE: the plain policy gradient with discounted returns and a group baseline."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from agilerl.builtins.algorithms.advantages import (
    discounted_returns,
    leave_one_out_mean,
    over_episodes,
    per_episode,
    per_turn_to_tokens,
    rewards_at_turn_ends,
    to_rows,
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
        if self.config.baseline == "leave_one_out":  # over the group's episodes, not its rows
            episodes = per_episode(episode_return, batch)
            baseline = to_rows(leave_one_out_mean(episodes, per_episode(batch.group, batch)), batch)
        advantages = (returns - baseline[:, None]) * mask
        loss = -masked_mean(correction.weigh(advantages) * logprobs, correction.mask)
        return loss, {
            "advantage_abs_mean": masked_mean(advantages.abs(), mask).item(),
            "turn_level": float(granularity == "turn"),
        }

    def returns(
        self, batch: RolloutTensors, granularity: Literal["turn", "token"]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token returns ``[B, T]`` and each row's episode's return from its first step ``[B]``
        (returns run over the whole episode, across its rows)."""
        gamma = self.config.gamma
        if granularity == "turn":  # every row holds its episode's turn rewards
            per_turn = discounted_returns(batch.turn_rewards, batch.turn_mask, gamma)
            return per_turn_to_tokens(per_turn, batch.turn_ids), per_turn[:, 0]
        per_token = over_episodes(
            batch, lambda r, m: discounted_returns(r, m, gamma), rewards_at_turn_ends(batch), batch.action_mask
        )
        first, _ = turn_action_bounds(batch.turn_ids, batch.action_mask, batch.max_turns)
        at_first = per_token.gather(1, first[:, :1].clamp(min=0)).squeeze(1)
        if batch.is_split:  # the episode's first turn is in its first row
            at_first = to_rows(at_first[batch.episode_starts], batch)
        return per_token, at_first

