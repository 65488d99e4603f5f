"""What an algorithm is: a config, a loss, and what it needs from the trainer.

Writing one (built-ins and third parties alike)::

    class MyConfig(AlgorithmConfig):
        beta: float = 0.0                       # every field is an ``algorithm:`` key


    class MyAlgorithm(Algorithm[MyConfig]):
        config_class = MyConfig
        kind = "rollout"                        # batches are RolloutTensors

        def loss(self, policy, batch, reference=None):
            logprobs = policy_logprobs(policy, batch.input_ids, batch.attention_mask)
            loss = -masked_mean(logprobs * batch.turn_rewards.sum(1, keepdim=True), batch.loss_mask)
            return loss, {"loss": loss.item()}

then register it (``register("mine", "my_pkg.algo:MyAlgorithm")`` in a ``register_algorithms``
hook) and write ``algorithm: {name: mine, beta: 0.1}`` in a manifest.

The trainer's side of the contract:

- ``kind == "rollout"``: ``batch`` is :class:`~agilerl.train.batch.RolloutTensors`;
  ``kind == "dataset"``: ``batch`` is the dict of tensors ``DatasetEnv`` yields for
  ``dataset_objective`` (``"sft"`` or ``"preference"``).
- ``prepare_policy(model)`` returns the module the optimiser trains (the model itself, or the model
  wrapped with extra heads); generation keeps using ``model``.
- ``sampling_temperature``: the temperature rollouts must be sampled at (None: any);
  :func:`~agilerl.train.compatibility.check_compatible` holds the collector to it.
- ``needs_reference``: the trainer passes the frozen initial model as ``reference`` (a copy, or
  with LoRA the model with its adapters off); otherwise it passes None and keeps nothing.
- ``loss`` returns the scalar to minimise and plain-float metrics to log. The trainer takes one
  optimiser step per batch, so the current log-probs, detached, are the trainer's recomputed ones;
  a rollout batch's ``old_logprobs`` are the sampler's (None when a rollout lacks them), which may
  differ (another engine, older weights in async training): the built-in algorithms correct for
  the gap (``agilerl.builtins.algorithms.off_policy``, docs/algorithms.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import ConfigDict, ValidationError

from agilerl.errors import ConfigError
from agilerl.manifest.settings import ManifestModel
from agilerl.manifest.spec import format_validation_error

if TYPE_CHECKING:
    import torch

__all__ = ["AlgorithmConfig", "Algorithm", "build_algorithm"]


class AlgorithmConfig(ManifestModel):
    """Base of every algorithm config: the manifest's ``algorithm:`` mapping without ``name``.

    Unknown keys are errors, not warnings: a misspelt hyperparameter silently left at its
    default wastes a training run. Floats are finite and numbers are never bools, as in every
    manifest section.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig)


class Algorithm(ABC, Generic[ConfigT]):
    """A training objective; subclasses set ``config_class`` and ``kind`` and define ``loss``."""

    config_class: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    kind: ClassVar[Literal["rollout", "dataset"]] = "rollout"
    dataset_objective: ClassVar[Literal["sft", "preference"] | None] = None
    """For ``kind == "dataset"``: the ``environment.objective`` whose batches ``loss`` reads."""

    def __init__(self, config: ConfigT | None = None) -> None:
        self.config: ConfigT = config or self.config_class()  # type: ignore[assignment]

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], *, name: str | None = None) -> Algorithm[Any]:
        """Build from an ``algorithm:`` mapping (without ``name``); errors name each bad key."""
        label = name or cls.__name__
        try:
            config = cls.config_class.model_validate(dict(mapping))
        except ValidationError as exc:
            known = ", ".join(sorted(cls.config_class.model_fields)) or "(none)"
            lines = [
                f"{line} ({label} takes: {known})" if "Extra inputs" in line else line
                for line in format_validation_error(exc, "algorithm")
            ]
            raise ConfigError(lines, "algorithm settings") from None
        return cls(config)  # type: ignore[arg-type]

    @property
    def needs_reference(self) -> bool:
        """Whether ``loss`` reads a frozen reference model (e.g. a KL penalty with beta > 0)."""
        return False

    def prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the optimiser trains; override to add heads (a value head for PPO)."""
        return model

    @property
    def sampling_temperature(self) -> float | None:
        """The temperature the collector must sample at for ``loss`` to score its tokens right
        (old log-probs are taken at it); None: any. The manifest's collector samples at it."""
        return None

    @abstractmethod
    def loss(
        self, policy: torch.nn.Module, batch: Any, reference: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar to minimise on ``batch`` and the metrics to log."""


def build_algorithm(
    section: Mapping[str, Any], *, base_dir: str | Path | None = None
) -> Algorithm[Any]:
    """Resolve ``section["name"]`` (registered name or ``module:attr``) and validate the rest."""
    from agilerl.registry import resolve

    name = section.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(
            [f"algorithm.name: expected a registered algorithm name such as 'grpo' (got {name!r})."]
        )
    target = resolve("algorithm", name, base_dir=base_dir)
    if not (isinstance(target, type) and issubclass(target, Algorithm)):
        raise ConfigError(
            [
                f"algorithm.name: {name!r} resolves to {target!r}, which is not a subclass of "
                "agilerl.train.algorithm.Algorithm."
            ]
        )
    return target.from_mapping({k: v for k, v in section.items() if k != "name"}, name=name)
