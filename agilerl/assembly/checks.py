"""What ``agilerl train`` would refuse, found before a run: names no plugin registered, files that
do not exist, references that do not import, algorithm options the algorithm does not take."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import AgileRLError, ConfigError, LoadError, MissingExtra
from agilerl.manifest.environment import (
    AgentSpec, DatasetSpec, EntrypointSpec, EnvironmentSpec, EnvUrlSpec, ScoredDatasetSpec,
)
from agilerl.manifest.spec import Manifest
from agilerl.registry import Kind, get_registry, is_reference, load_object
from agilerl.registry.loading import split_reference

if TYPE_CHECKING:
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.algorithm import Algorithm
    from agilerl.train.compatibility import EnvSource

__all__ = ["manifest_problems", "env_source", "compatible_algorithm"]

_DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".arrow")


def manifest_problems(manifest: Manifest, *, offline: bool = False) -> list[str]:
    """One ``field.path: problem`` line per problem; ``offline`` imports no env, rubric or
    algorithm code (registered names and file paths are still checked)."""
    env, base = manifest.environment, manifest.base_dir
    problems: list[str] = []
    if isinstance(env, EntrypointSpec) and not env.env_packages:  # with them, a missing one is installed
        problems += _reference("env", "environment.entrypoint", env.entrypoint, base, offline)
    if isinstance(env, (EntrypointSpec, EnvUrlSpec)) and env.observation_processor:
        problems += _reference("processor", "environment.observation_processor", env.observation_processor, base, offline)
    if isinstance(env, ScoredDatasetSpec):
        if env.rubrics is not None:
            for i, entry in enumerate(env.rubrics):
                problems += _reference("rubric", f"environment.rubrics.{i}.rubric", entry.rubric, base, offline)
        elif env.rubric_file_path:
            problems += _reference("rubric", "environment.rubric_file_path", f"{env.rubric_file_path}:{env.rubric_name}", base, offline)
        else:
            problems += _reference("rubric", "environment.rubric_name", env.rubric_name or "", base, offline)
    if isinstance(env, (ScoredDatasetSpec, DatasetSpec)) and env.dataset.endswith(_DATA_SUFFIXES) and not (base / env.dataset).exists():
        problems.append(f"environment.dataset: file not found: {base / env.dataset}")
    if isinstance(env, AgentSpec):
        problems += _agent_problems(env, base, offline)
    problems += _reference("algorithm", "algorithm.name", manifest.algorithm.name, base, offline=True)
    for tracker in manifest.training.report_to:
        problems += _reference("tracker", "training.report_to", tracker, base, offline=True)
    if not problems and not offline and importlib.util.find_spec("torch") is not None:
        problems += _algorithm_options(manifest)
    return problems


def _agent_problems(env: AgentSpec, base: Path, offline: bool) -> list[str]:
    """An agent's program (found on PATH or in the manifest's folder, its script there too), its
    function, rubrics and task file."""
    problems: list[str] = []
    if env.agent_command is not None:
        program, *args = env.agent_command
        if program not in ("python", "python3") and shutil.which(program) is None and not (base / program).is_file():
            problems.append(f"environment.agent_command: {program!r} is neither on PATH nor a file in {base}")
        for arg in args[:1]:  # the script a program runs (python agent.py) is in the manifest's folder
            if arg.endswith(".py") and not (base / arg).is_file():
                problems.append(f"environment.agent_command: file not found: {base / arg}")
    elif env.agent is not None and not is_reference(env.agent):
        problems.append(f"environment.agent: {env.agent!r} names no function: write 'path/to/file.py:fn' or 'module:fn'")
    elif env.agent is not None:
        problems += _reference("env", "environment.agent", env.agent, base, offline)
    for i, entry in enumerate(env.rubrics or []):
        problems += _reference("rubric", f"environment.rubrics.{i}.rubric", entry.rubric, base, offline)
    if env.dataset is not None and env.dataset.endswith(_DATA_SUFFIXES) and not (base / env.dataset).exists():
        problems.append(f"environment.dataset: file not found: {base / env.dataset}")
    return problems


def _reference(kind: Kind, field: str, ref: str, base: Path, offline: bool) -> list[str]:
    try:
        if not is_reference(ref):
            get_registry().get(kind, ref)
        elif offline:
            _exists(ref, base)
        else:
            with MissingExtra.translate(repr(ref)):  # an env file that imports an extra's module
                load_object(ref, base)
    except AgileRLError as exc:
        return [f"{field}: {exc}"]
    except Exception as exc:  # the user's module raised while importing
        return [f"{field}: importing {ref!r} failed: {type(exc).__name__}: {exc}"]
    return []


def _exists(ref: str, base: Path) -> None:
    """Without importing: the file or the module of a reference exists."""
    target, _ = split_reference(ref)
    if target.endswith(".py") or "/" in target:
        if not (base / target).is_file():
            raise LoadError(f"file not found: {base / target}")
    elif importlib.util.find_spec(target.split(".")[0]) is None:
        raise LoadError(f"module {target!r} is not installed")


def env_source(spec: EnvironmentSpec) -> EnvSource:
    """What ``check_compatible`` needs from an ``environment:`` section, read here only: the
    batches it yields and its objective (only an SFT/DPO dataset has one)."""
    from agilerl.train.compatibility import EnvSource

    return EnvSource(spec.env_type, spec.objective if isinstance(spec, DatasetSpec) else None)


def compatible_algorithm(
    manifest: Manifest, training: TrainingSettings | None = None
) -> tuple[Algorithm[Any], SamplingParams | None]:
    """The manifest's algorithm and the sampling its collector uses (None for SFT/DPO data),
    once ``check_compatible`` accepts them: no model is loaded before this. ``training``
    overrides the manifest's (the CLI's flags)."""
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.algorithm import build_algorithm
    from agilerl.train.compatibility import check_compatible

    algorithm = build_algorithm(manifest.algorithm.as_mapping(), base_dir=manifest.base_dir)
    source, training = env_source(manifest.environment), training or manifest.training
    sampling = None
    if source.kind == "rollout":
        sampling = SamplingParams(
            top_p=training.top_p, top_k=training.top_k, max_new_tokens=training.max_new_tokens
        )
        if algorithm.sampling_temperature is not None:  # the one place the collector's comes from
            sampling = replace(sampling, temperature=algorithm.sampling_temperature)
    check_compatible(algorithm, source, sampling)
    return algorithm, sampling


def _algorithm_options(manifest: Manifest) -> list[str]:
    try:
        compatible_algorithm(manifest)
    except ConfigError as exc:
        return exc.errors
    return []
