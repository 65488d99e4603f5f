"""SFT: cross-entropy on the response tokens of ``DatasetEnv`` batches (objective ``sft``)."""

from __future__ import annotations

from torch import Tensor
from torch.nn import Module

from agilerl.train.algorithm import Algorithm, AlgorithmConfig
from agilerl.train.logprobs import masked_mean, policy_logprobs

__all__ = ["SFTConfig", "SFT"]


class SFTConfig(AlgorithmConfig):
    """SFT takes no options: the data decides what is learned."""


class SFT(Algorithm[SFTConfig]):
    """Supervised fine-tuning: the mean negative log-likelihood of every response token."""

    config_class = SFTConfig
    kind = "dataset"
    dataset_objective = "sft"

    def loss(
        self, policy: Module, batch: dict[str, Tensor], reference: Module | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        logprobs = policy_logprobs(
            policy, batch["input_ids"], batch["attention_mask"], mask=batch["loss_mask"]
        )
        loss = -masked_mean(logprobs, batch["loss_mask"])
        return loss, {"loss": loss.item(), "perplexity": loss.detach().exp().item()}
