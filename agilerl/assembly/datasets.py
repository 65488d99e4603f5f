"""From a dataset ``environment:`` spec to dataset envs: the table loaded once with its columns and
env_config, then a ``QADatasetEnv`` factory (a scored rollout) or a ``DatasetEnv`` (SFT/DPO data).
The mapping behind ``QADatasetEnv.from_spec`` and ``DatasetEnv.from_spec``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agilerl.data.dataset_env import DatasetEnv
from agilerl.data.qa_dataset import QADataset, QADatasetEnv
from agilerl.data.composite import CompositeRubric, RubricEntry, RubricGate
from agilerl.data.rubric import Rubric, load_rubric
from agilerl.data.tables import DATASET_ENV_CONFIG_KEYS, load_table
from agilerl.errors import DatasetLoadError
from agilerl.manifest.environment import DatasetSpec, EnvironmentSpec, ScoredDatasetSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from datasets import Dataset

__all__ = ["load_spec_table", "load_spec_rubric", "load_qa_dataset", "qa_env_factory", "dataset_env_from_spec"]

Env = TypeVar("Env", bound=DatasetEnv)


def load_spec_table(
    spec: ScoredDatasetSpec | DatasetSpec, *, base_dir: str | Path | None = None
) -> tuple[Dataset, dict[str, Any]]:
    """Load a manifest's ``dataset`` with its ``columns``; also return its checked env_config."""
    config = dict(spec.env_config)
    unknown = sorted(set(config) - set(DATASET_ENV_CONFIG_KEYS))
    if unknown:
        raise DatasetLoadError(
            f"env_config: {', '.join(unknown)} not understood by a dataset-backed env; it "
            f"takes {', '.join(DATASET_ENV_CONFIG_KEYS)}."
        )
    table = load_table(
        spec.dataset,
        base_dir=base_dir,
        columns=spec.columns,
        subset=config.get("subset"),
        split=config.get("split", "train"),
    )
    return table, config


def load_qa_dataset(
    spec: EnvironmentSpec, *, base_dir: str | Path | None = None
) -> tuple[QADataset, str | None]:
    """Load, rename, check and split a manifest's dataset once; also return its system prompt."""
    if not isinstance(spec, ScoredDatasetSpec):
        raise DatasetLoadError(
            "QADatasetEnv needs 'env_type: rollout' with 'dataset' and 'rubric_name' (for SFT/DPO "
            "data, 'env_type: dataset', use DatasetEnv)."
        )
    table, config = load_spec_table(spec, base_dir=base_dir)
    rubric = load_spec_rubric(spec, base_dir=base_dir)
    data = QADataset.build(
        table,
        rubric,
        prompt_template=spec.prompt_template,
        train_test_split=spec.train_test_split,
        split_seed=int(config.get("split_seed", 0)),
        max_reward=spec.max_reward,
    )
    return data, config.get("system_prompt")


def load_spec_rubric(spec: ScoredDatasetSpec, *, base_dir: str | Path | None = None) -> Rubric:
    """The spec's reward: ``rubric_name`` as it is, or ``rubrics:``/``rubric_gates:`` as one
    ``CompositeRubric`` (each entry loaded, a factory called with its ``config``)."""
    if spec.rubrics is None:
        assert spec.rubric_name is not None  # the spec's validator requires one of the two
        return load_rubric(spec.rubric_name, spec.rubric_file_path, base_dir=base_dir)
    entries = [
        RubricEntry(e.name, load_rubric(e.rubric, base_dir=base_dir, config=e.config), e.weight)
        for e in spec.rubric_entries
    ]
    gates = [RubricGate(g.component, g.min, tuple(g.zeroes or ())) for g in spec.rubric_gates]
    return Rubric.bind(CompositeRubric(entries, gates), name="rubrics")


def qa_env_factory(
    spec: EnvironmentSpec, *, base_dir: str | Path | None = None
) -> Callable[[], QADatasetEnv]:
    """Load the dataset once; the returned factory makes envs that all share it."""
    data, system_prompt = load_qa_dataset(spec, base_dir=base_dir)

    def make_env() -> QADatasetEnv:
        return QADatasetEnv(data, system_prompt=system_prompt)

    return make_env


def dataset_env_from_spec(
    env_class: type[Env],
    spec: EnvironmentSpec,
    tokenizer: Any,
    *,
    base_dir: str | Path | None = None,
    **options: Any,
) -> Env:
    """``DatasetEnv.from_spec``: the spec's SFT or preference rows, tokenized and split;
    ``options`` are the constructor's own (``max_context_length``, ``batch_size``, ...)."""
    if not isinstance(spec, DatasetSpec):
        raise DatasetLoadError(
            "DatasetEnv needs 'env_type: dataset' with 'objective: sft' or 'objective: preference'."
        )
    table, config = load_spec_table(spec, base_dir=base_dir)
    return env_class(
        table,
        tokenizer,
        spec.objective,
        prompt_template=spec.prompt_template,
        response_column=spec.response_column,
        system_prompt=config.get("system_prompt"),
        chat_template_kwargs=spec.chat_template_kwargs,
        train_test_split=spec.train_test_split,
        split_seed=int(config.get("split_seed", 0)),
        **options,
    )
