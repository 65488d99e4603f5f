"""One training run from a manifest: what ``agilerl train`` does, callable from Python too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agilerl.errors import ConfigError, ManifestError
from agilerl.manifest.spec import Manifest, format_validation_error
from agilerl.manifest.settings import TrainingSettings
from agilerl.train.loops import TrainResult

__all__ = ["train_from_manifest"]


def train_from_manifest(
    manifest: Manifest,
    *,
    overrides: dict[str, Any] | None = None,
    resume: str | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Build model, algorithm and env from ``manifest`` and train.

    ``overrides`` replace ``training:`` keys (the CLI's ``--max-steps``, ``--output-dir``);
    ``output_dir`` defaults to ``runs/<the manifest's folder name>``.
    ``resume`` (a checkpoint folder or ``latest``) wins over ``training.resume_from``.
    """
    from agilerl.assembly.checks import compatible_algorithm
    from agilerl.train.checkpoint import check_resumable, find_checkpoint
    from agilerl.train.distributed import current_world
    from agilerl.assembly.models import load_model_and_tokenizer

    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    overrides.setdefault("output_dir", manifest.output_dir)  # runs/<manifest folder> by default
    training = _with_overrides(manifest.training, overrides)
    spec, base_dir = manifest.environment, manifest.base_dir
    try:
        algorithm, sampling = compatible_algorithm(manifest, training)
    except ConfigError as exc:  # in a manifest run, the manifest is what to fix
        raise ManifestError(exc.errors) from None
    world = current_world()  # before the collector: ranks shard tasks
    resume_ref = resume or training.resume_from
    checkpoint = find_checkpoint(resume_ref, training.output_dir) if resume_ref else None
    if checkpoint is not None:  # the same kind of run, or a clear error before any weights load
        check_resumable(checkpoint, algorithm=type(algorithm).__name__, lora=manifest.model.lora is not None)
    with _transformers_bars(show_progress):
        model, tokenizer = load_model_and_tokenizer(
            manifest.model, base_dir=base_dir, seed=training.seed, checkpoint=checkpoint
        )
    # the trainer's accelerator places (or shards) the model on this process's device
    common: dict[str, Any] = {"resume_from": checkpoint, "show_progress": show_progress}
    if spec.env_type == "dataset":
        from agilerl.data.dataset_env import DatasetEnv
        from agilerl.train.loops import train_llm_dataset

        dataset = DatasetEnv.from_spec(
            spec, tokenizer, base_dir=base_dir, max_context_length=training.max_context_length,
            batch_size=training.batch_size, seed=training.seed,
        )
        return train_llm_dataset(model, tokenizer, dataset, algorithm, training, **common)

    from agilerl.manifest.environment import AgentSpec
    from agilerl.assembly.env_factory import placement
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.train.loops import train_llm_rollout

    if isinstance(spec, AgentSpec):  # agent programs play whole episodes against the served policy
        from agilerl.assembly.agents import agent_collector_from_spec

        collector: Any = agent_collector_from_spec(
            spec, tokenizer, batch_size=training.batch_size, group_size=training.group_size,
            base_dir=base_dir, sampling=sampling, seed=training.seed,
            rank=world.rank, world_size=world.world_size, model_name=manifest.model.name_or_path,
        )
    else:
        collector = RolloutCollector.from_spec(
            spec, tokenizer, batch_size=training.batch_size, group_size=training.group_size,
            base_dir=base_dir, sampling=sampling, seed=training.seed,
            rank=world.rank, world_size=world.world_size,
        )
    with collector:
        return train_llm_rollout(
            model, tokenizer, collector, algorithm, training,
            max_model_len=manifest.model.max_model_len,
            generation=_generation(manifest, model, tokenizer, seed=training.seed),
            env_placement=placement(spec),  # None for a fleet: it says where each replica runs as it starts
            **common,
        )


def _generation(manifest: Manifest, model: Any, tokenizer: Any, *, seed: int) -> Any:
    """The policy the ``generation:`` backend builds for ``model`` (default: ``transformers``)."""
    from agilerl.errors import InvalidArgument
    from agilerl.generation.backends import build_generation

    settings = manifest.generation
    try:
        return build_generation(
            settings.backend, model, tokenizer, max_model_len=manifest.model.max_model_len, seed=seed,
            options=settings.options,
        )
    except InvalidArgument as exc:  # in a manifest run, the manifest is what to fix
        raise ManifestError([str(exc)]) from None


def _with_overrides(training: TrainingSettings, overrides: dict[str, Any]) -> TrainingSettings:
    from pydantic import ValidationError

    if not overrides:
        return training
    try:
        # only what the manifest set: a dump of every default would mark them all as set, and the
        # validators that ask what was set (max_staleness, task_sampling_floor) would misfire
        return TrainingSettings.model_validate({**training.model_dump(exclude_unset=True), **overrides})
    except ValidationError as exc:
        raise ManifestError(format_validation_error(exc, "training")) from None


@contextmanager
def _transformers_bars(show: bool) -> Iterator[None]:
    """``show_progress=False`` (``--no-progress``) silences transformers' loading bars too, for
    this load only."""
    from transformers.utils import logging as hf_logging

    if show or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
