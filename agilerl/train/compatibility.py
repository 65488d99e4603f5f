"""Does this algorithm fit this env source and this sampling? Asked once, before any model loads.

``agilerl train``, ``agilerl manifest check`` and the Python loops all ask through
:func:`check_compatible`, so each mismatch has one message and one error type (``ConfigError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agilerl.errors import ConfigError

if TYPE_CHECKING:
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.algorithm import Algorithm

__all__ = ["BatchKind", "EnvSource", "check_compatible"]

BatchKind = Literal["rollout", "dataset"]

_SOURCE_FOR: dict[str, str] = {
    "rollout": "an env that plays episodes (env_type 'rollout': an entrypoint, an env_url or a "
    "dataset with a rubric; train_llm_rollout with a RolloutCollector in Python)",
    "dataset": "SFT/DPO data (env_type 'dataset' with an objective; train_llm_dataset with a "
    "DatasetEnv in Python)",
}
_ALGORITHMS_FOR: dict[str, str] = {
    "rollout": "grpo, gspo, cispo, llmppo, llmreinforce",
    "dataset": "sft for objective 'sft', dpo for 'preference'",
}


@dataclass(frozen=True)
class EnvSource:
    """What an algorithm is checked against: the batches a source yields, and how errors name it.

    ``kind_field`` and ``objective_field`` are what the user changes to fix a mismatch: the
    manifest's ``environment.env_type``/``environment.objective``, or the Python loop and object.
    """

    kind: BatchKind
    objective: Literal["sft", "preference"] | None = None
    kind_field: str = "environment.env_type"
    objective_field: str = "environment.objective"


def check_compatible(
    algorithm: Algorithm[Any], source: EnvSource, sampling: SamplingParams | None = None
) -> None:
    """Raise ``ConfigError`` naming the field and the fix when ``source`` cannot feed
    ``algorithm``'s batches or ``sampling`` is not the temperature its loss scores at."""
    name = type(algorithm).__name__
    if algorithm.kind != source.kind:
        raise ConfigError(
            [
                f"{source.kind_field}: algorithm {name} trains on {algorithm.kind} batches, not "
                f"{source.kind}; use {_SOURCE_FOR[algorithm.kind]}, or a {source.kind} algorithm "
                f"({_ALGORITHMS_FOR[source.kind]})."
            ],
            "algorithm for this environment",
        )
    wanted = algorithm.dataset_objective
    if wanted is not None and source.objective != wanted:
        raise ConfigError(
            [
                f"{source.objective_field}: algorithm {name} trains on '{wanted}' batches but the "
                f"objective is {source.objective!r}; set it to '{wanted}', or use the algorithm "
                f"for {source.objective!r} ({_ALGORITHMS_FOR['dataset']})."
            ],
            "algorithm for this environment",
        )
    temperature = algorithm.sampling_temperature
    if sampling is not None and temperature is not None and sampling.temperature != temperature:
        raise ConfigError(
            [
                f"sampling.temperature: the collector samples at temperature {sampling.temperature} "
                f"but {name} scores log-probs at {temperature}; build the collector with "
                f"sampling=SamplingParams(temperature={temperature}, ...) or set "
                f"algorithm.temperature: {sampling.temperature}."
            ],
            "sampling for this algorithm",
        )
