"""DPO: preference pairs from ``DatasetEnv`` (objective ``preference``), sigmoid loss."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor
from torch.nn import Module

from agilerl.errors import InvalidArgument
from agilerl.train.algorithm import Algorithm, AlgorithmConfig
from agilerl.train.logprobs import policy_logprobs

__all__ = ["DPOConfig", "DPO", "dpo_loss", "stack_pairs"]


class DPOConfig(AlgorithmConfig):
    """DPO's options."""

    beta: float = Field(0.1, gt=0, description="Inverse temperature of the implicit reward.")


class DPO(Algorithm[DPOConfig]):
    """Direct Preference Optimization: ``-log sigmoid(beta * (chosen - rejected log-ratio))``."""

    config_class = DPOConfig
    kind = "dataset"
    dataset_objective = "preference"

    @property
    def needs_reference(self) -> bool:
        return True

    def loss(
        self, policy: Module, batch: dict[str, Tensor], reference: Module | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        if reference is None:
            raise InvalidArgument("DPO needs the frozen reference model: pass reference=.")
        input_ids, attention_mask, loss_mask = stack_pairs(batch)
        policy_sums = (policy_logprobs(policy, input_ids, attention_mask, mask=loss_mask) * loss_mask).sum(dim=1)
        with torch.no_grad():
            reference_sums = (
                policy_logprobs(reference, input_ids, attention_mask, mask=loss_mask) * loss_mask
            ).sum(dim=1)
        return dpo_loss(policy_sums, reference_sums, self.config.beta)


def dpo_loss(
    policy_sums: torch.Tensor, reference_sums: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sigmoid DPO loss from summed response log-probs, chosen rows first then rejected."""
    rewards = beta * (policy_sums - reference_sums)
    chosen, rejected = rewards.chunk(2)
    margins = chosen - rejected
    loss = -torch.nn.functional.logsigmoid(margins).mean()
    return loss, {
        "loss": loss.item(),
        "reward_accuracy": (margins > 0).float().mean().item(),
        "reward_margin": margins.mean().item(),
        "chosen_reward": chosen.mean().item(),
        "rejected_reward": rejected.mean().item(),
    }


def stack_pairs(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chosen rows then rejected rows, padded to one width, so both share one forward pass."""
    width = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])

    def stacked(key: str) -> torch.Tensor:
        parts = [batch[f"{side}_{key}"] for side in ("chosen", "rejected")]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])

    return stacked("input_ids"), stacked("attention_mask"), stacked("loss_mask")
