"""LLMPPO: PPO for language models, with a value head and GAE over tokens or turns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from pydantic import Field

from agilerl.builtins.algorithms.advantages import (
    gae,
    merge_turns,
    over_episodes,
    per_turn_to_tokens,
    rewards_at_turn_ends,
    to_rows,
    turn_action_bounds,
    whiten,
)
from agilerl.builtins.algorithms.off_policy import Correction
from agilerl.builtins.algorithms.policy_gradient import (
    ClippedConfig,
    PolicyGradient,
    TurnOrTokenConfig,
    clipped_surrogate,
)
from agilerl.train.batch import RolloutTensors
from agilerl.train.logprobs import masked_mean

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["ValueHeadOutput", "ValueHeadModel", "LLMPPOConfig", "LLMPPO"]


@dataclass
class ValueHeadOutput:
    logits: torch.Tensor
    values: torch.Tensor
    """``values[b, t]``: the value of the state before token ``t`` (aligned like log-probs)."""


class ValueHeadModel(torch.nn.Module):
    """A causal LM plus a linear value head on its last hidden state; ``.model`` is the LM."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        parameter = next(model.parameters())
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.value_head = torch.nn.Linear(
            text_config.hidden_size, 1, device=parameter.device, dtype=parameter.dtype
        )
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int = 0, **images: Any
    ) -> ValueHeadOutput:
        """``images``: a vision model's image inputs (``pixel_values``, ...), passed on."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            logits_to_keep=logits_to_keep,
            **images,
        )
        values = self.value_head(out.hidden_states[-1]).squeeze(-1).float()
        return ValueHeadOutput(
            logits=out.logits, values=torch.nn.functional.pad(values[:, :-1], (1, 0))
        )


class LLMPPOConfig(TurnOrTokenConfig, ClippedConfig):
    """PPO's options."""

    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE's bias/variance trade-off.")
    value_coef: float = Field(0.1, ge=0, description="Weight of the value loss.")
    whiten_advantages: bool = Field(True, description="Normalise advantages over the batch.")


class LLMPPO(PolicyGradient[LLMPPOConfig]):
    """Proximal Policy Optimization with a learned value baseline."""

    config_class = LLMPPOConfig

    def prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        return ValueHeadModel(cast("PreTrainedModel", model))

    def policy_loss(
        self, logprobs: torch.Tensor, outputs: Any, batch: RolloutTensors, correction: Correction
    ) -> tuple[torch.Tensor, dict[str, float]]:
        config, mask = self.config, batch.loss_mask
        granularity = config.granularity_for(batch)
        # GAE runs over whole episodes: an episode split into rows bootstraps across them
        if granularity == "token":
            predicted, value_mask = outputs.values, mask
            advantages = over_episodes(
                batch,
                lambda r, v, m: gae(r, v, m, config.gamma, config.gae_lambda),
                rewards_at_turn_ends(batch),
                predicted.detach(),
                value_mask,
            )
            returns = advantages + predicted.detach()
        else:
            first, _ = turn_action_bounds(batch.turn_ids, batch.action_mask, batch.max_turns)
            predicted = outputs.values.gather(1, first.clamp(min=0))
            value_mask = batch.turn_mask & (first >= 0) & batch.valid[:, None]
            values, present = merge_turns(predicted.detach(), value_mask, batch)
            rewards, _ = merge_turns(batch.turn_rewards, batch.turn_mask & (first >= 0), batch)
            advantages = gae(rewards, values, present, config.gamma, config.gae_lambda)
            returns = to_rows(advantages + values, batch)
            advantages = per_turn_to_tokens(to_rows(advantages, batch), batch.turn_ids) * mask
        if config.whiten_advantages:
            advantages = whiten(advantages, mask)
        ratio = torch.exp(logprobs - logprobs.detach())
        objective, clipped = clipped_surrogate(
            ratio, correction.weigh(advantages), config.epsilon_low, config.epsilon_high
        )
        value_loss = 0.5 * masked_mean((predicted - returns) ** 2, value_mask)
        loss = -masked_mean(objective, correction.mask) + config.value_coef * value_loss
        return loss, {
            "value_loss": value_loss.item(),
            "clip_fraction": masked_mean(clipped.float(), correction.mask).item(),
            "turn_level": float(granularity == "turn"),
        }
