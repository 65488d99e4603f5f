"""What every rollout algorithm shares: the forward pass, the loss mask, the off-policy
correction and the KL to a reference.

A subclass supplies ``policy_loss`` (advantages and objective), applying the
:class:`~agilerl.builtins.algorithms.off_policy.Correction` it is handed; this base adds
``beta * KL(policy || reference)`` with the k3 estimator and the common metrics.

The clipped ratios take the trainer's own log-probs, detached, as their denominator: the trainer
takes one optimiser step per batch, so these are the log-probs it recomputes for the weights
being updated. The sampler's log-probs enter through the correction only (``off_policy.py``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal, TypeVar

import torch
from pydantic import AliasChoices, Field

from agilerl.builtins.algorithms.advantages import per_episode
from agilerl.builtins.algorithms.off_policy import Correction, OffPolicyConfig, off_policy_correction
from agilerl.errors import InvalidArgument
from agilerl.train.algorithm import Algorithm
from agilerl.train.batch import RolloutTensors
from agilerl.train.logprobs import forward, masked_mean, policy_logprobs, token_logprobs

__all__ = [
    "GRANULARITY_KEYS",
    "PolicyGradientConfig",
    "ClippedConfig",
    "PolicyGradient",
    "clipped_surrogate",
    "TurnOrTokenConfig",
]

GRANULARITY_KEYS = AliasChoices("advantage_granularity", "action_granularity")
"""``action_granularity`` is accepted as an alias of ``advantage_granularity``."""


class PolicyGradientConfig(OffPolicyConfig):
    """Options every rollout algorithm takes (the off-policy correction's among them)."""

    beta: float = Field(
        0.0,
        ge=0,
        description="Weight of the KL penalty to the frozen reference; 0 keeps no reference.",
    )
    temperature: float = Field(
        1.0, gt=0, description="The sampling temperature; log-probs are taken at the same one."
    )


class ClippedConfig(PolicyGradientConfig):
    """Options of the algorithms that clip an importance ratio to ``[1 - low, 1 + high]``."""

    epsilon_low: float = Field(0.2, ge=0, description="Lower clip range of the importance ratio.")
    epsilon_high: float = Field(0.2, ge=0, description="Upper clip range of the importance ratio.")


ConfigT = TypeVar("ConfigT", bound=PolicyGradientConfig)


class PolicyGradient(Algorithm[ConfigT]):
    """Base of the rollout algorithms: subclasses define :meth:`policy_loss`."""

    kind = "rollout"

    @property
    def needs_reference(self) -> bool:
        return self.config.beta > 0

    @property
    def sampling_temperature(self) -> float:
        return self.config.temperature

    def loss(
        self,
        policy: torch.nn.Module,
        batch: RolloutTensors,
        reference: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        outputs = forward(policy, batch.input_ids, batch.attention_mask, batch.loss_mask, media=batch.media)
        logprobs = token_logprobs(
            outputs.logits, batch.input_ids, temperature=self.config.temperature
        )
        correction = off_policy_correction(logprobs.detach(), batch.old_logprobs, batch.loss_mask, self.config)
        loss, metrics = self.policy_loss(logprobs, outputs, batch, correction)
        metrics.update(correction.metrics)
        if self.config.beta > 0:
            kl = masked_mean(self._kl(logprobs, batch, reference), batch.loss_mask)
            loss = loss + self.config.beta * kl
            metrics["kl"] = kl.item()
        valid = per_episode(batch.valid, batch)  # per episode, however many rows each spans
        rewards = per_episode(batch.turn_rewards, batch).sum(dim=1)[valid]
        metrics["reward_mean"] = rewards.mean().item() if len(rewards) else 0.0
        metrics["valid_fraction"] = valid.float().mean().item()
        metrics["loss"] = loss.item()
        return loss, metrics

    @abstractmethod
    def policy_loss(
        self, logprobs: torch.Tensor, outputs: Any, batch: RolloutTensors, correction: Correction
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective without the KL term; ``outputs`` is the policy's forward output. The
        objective weighs its advantages with ``correction.weigh`` and averages over
        ``correction.mask`` (the loss mask less the tokens the correction rejected)."""

    def _kl(
        self, logprobs: torch.Tensor, batch: RolloutTensors, reference: torch.nn.Module | None
    ) -> torch.Tensor:
        """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1``, d = ref - pol."""
        if reference is None:
            raise InvalidArgument(
                f"{type(self).__name__} has beta={self.config.beta} and needs the reference model; "
                "pass reference= (the trainer does when needs_reference is true)."
            )
        with torch.no_grad():
            ref = policy_logprobs(
                reference,
                batch.input_ids,
                batch.attention_mask,
                temperature=self.config.temperature,
                mask=batch.loss_mask,
                media=batch.media,
            )
        diff = ref - logprobs
        return torch.exp(diff) - diff - 1


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic objective ``min(r A, clip(r) A)`` and where the clipped side won."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - epsilon_low, 1 + epsilon_high) * advantages
    return torch.minimum(unclipped, clipped), clipped < unclipped


class TurnOrTokenConfig(PolicyGradientConfig):
    """Options of the algorithms that credit tokens or turns with discounted returns."""

    advantage_granularity: Literal["auto", "turn", "token"] = Field(
        "auto",
        validation_alias=GRANULARITY_KEYS,
        description=(
            "'token': returns run token by token (each turn's reward on its last token); 'turn': "
            "one return per turn, shared by its tokens; 'auto': 'turn' for multi-turn batches, "
            "else 'token'."
        ),
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount per step (token or turn).")

    def granularity_for(self, batch: RolloutTensors) -> Literal["turn", "token"]:
        """The configured granularity, with ``auto`` settled for this batch."""
        from agilerl.builtins.algorithms.advantages import is_multi_turn

        if self.advantage_granularity != "auto":
            return self.advantage_granularity
        return "turn" if is_multi_turn(batch) else "token"
