"""What ``agilerl train`` would refuse, found before a run: names no plugin registered, files that
do not exist, references that do not import, algorithm options the algorithm does not take."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agilerl.errors import AgileRLError, ConfigError, LoadError, MissingExtra
from agilerl.manifest.environment import DatasetSpec, EntrypointSpec, EnvUrlSpec, ScoredDatasetSpec
from agilerl.manifest.spec import Manifest
from agilerl.registry import Kind, get_registry, is_reference, load_object
from agilerl.registry.loading import split_reference

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
        if env.rubric_file_path:
            problems += _reference("rubric", "environment.rubric_file_path", f"{env.rubric_file_path}:{env.rubric_name}", base, offline)
        else:
            problems += _reference("rubric", "environment.rubric_name", env.rubric_name, base, offline)
    if isinstance(env, (ScoredDatasetSpec, DatasetSpec)) and env.dataset.endswith(_DATA_SUFFIXES) and not (base / env.dataset).exists():
        problems.append(f"environment.dataset: file not found: {base / env.dataset}")
    problems += _reference("algorithm", "algorithm.name", manifest.algorithm.name, base, offline=True)
    for tracker in manifest.training.report_to:
        problems += _reference("tracker", "training.report_to", tracker, base, offline=True)
    if not problems and not offline and importlib.util.find_spec("torch") is not None:
        problems += _algorithm_options(manifest)
    return problems


def _reference(kind: Kind, field: str, ref: str, base: Path, offline: bool) -> list[str]:
    try:
        if not is_reference(ref):
            get_registry().get(kind, ref)
        elif offline:
            _exists(ref, base)
        else:
            load_object(ref, base)
    except AgileRLError as exc:
        return [f"{field}: {exc}"]
    except ModuleNotFoundError as exc:  # an env file that imports an extra's module (openenv)
        missing = MissingExtra.for_module(exc.name or "", repr(ref))
        return [f"{field}: {missing or exc}"]
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


def _algorithm_options(manifest: Manifest) -> list[str]:
    from agilerl.train.algorithm import build_algorithm

    try:
        build_algorithm(manifest.algorithm.as_mapping(), base_dir=manifest.base_dir).check_environment(
            manifest.environment
        )
    except ConfigError as exc:
        return exc.errors
    return []
