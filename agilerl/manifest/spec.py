"""The manifest: every external input is parsed here, once, into pydantic models.

``environment:`` is the env spec (``agilerl.manifest.environment``); ``model:``, ``algorithm:``
and ``training:`` are read by the training loops. Errors name the field path, the value and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from agilerl.errors import ConfigError, ManifestError, validation_problems
from agilerl.manifest.environment import VARIANT_TAGS, EnvironmentSection, EnvironmentSpec
from agilerl.manifest.section import Section
from agilerl.manifest.settings import AlgorithmSettings, GenerationSettings, ModelSettings, TrainingSettings

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_VALUES",
    "EnvironmentSpec",
    "Manifest",
    "format_validation_error",
    "load_manifest",
    "non_finite_problems",
    "parse_env_spec",
    "parse_manifest",
]

MAX_MANIFEST_BYTES = 1_000_000
MAX_MANIFEST_VALUES = 100_000
"""A manifest is a few dozen values; YAML aliases can make a few hundred bytes expand to billions."""


class Manifest(Section):
    """A whole manifest file. ``model``/``algorithm``/``training`` are read by the trainer.

    An unknown section is an error: a typo'd ``trainig:`` would otherwise start a full default run."""

    _unknown_is_error: ClassVar[bool] = True
    model_config = ConfigDict(  # the schema says so too: editors flag a typo'd section
        json_schema_extra={"additionalProperties": False, "patternProperties": {"^x-": {}}}
    )

    @classmethod
    def _is_extension(cls, key: Any) -> bool:
        """``x-anything:`` holds YAML anchors for the sections to reuse (as in Compose files)."""
        return isinstance(key, str) and key.startswith("x-")

    environment: EnvironmentSection
    model: ModelSettings = Field(default_factory=ModelSettings)
    algorithm: AlgorithmSettings = Field(default_factory=AlgorithmSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @model_validator(mode="after")
    def _group_judges_see_whole_groups(self) -> Manifest:
        """``llm_judge_group`` ranks one GRPO group per call: a ``group_size`` other than the
        run's would rank part groups, or wait ``gather_s`` on every group for members that never
        come."""
        for index, entry in enumerate(getattr(self.environment, "rubrics", None) or []):
            size = (entry.config or {}).get("group_size")
            if entry.rubric == "llm_judge_group" and size is not None and size != self.training.group_size:
                raise ValueError(
                    f"environment.rubrics[{index}] ({entry.name}): llm_judge_group's config.group_size {size!r} is "
                    f"not training.group_size {self.training.group_size}: the judge ranks one group a call; set "
                    f"group_size: {self.training.group_size}"
                )
        return self

    @classmethod
    def _section_name(cls) -> str:
        return "manifest"

    @property
    def base_dir(self) -> Path:
        """The manifest's folder: relative paths in it resolve from here."""
        return self._base_dir

    @property
    def output_dir(self) -> str:
        """Where ``agilerl train`` writes: ``training.output_dir`` if set, else
        ``runs/<the manifest's folder name>``, so runs of different manifests never mix."""
        if "output_dir" in self.training.model_fields_set:
            return self.training.output_dir
        return str(Path("runs") / self.base_dir.name)


def format_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    """One ``field.path: message (got value)`` line per pydantic error (the env variants' tags left out)."""
    return validation_problems(exc, prefix, hidden=VARIANT_TAGS)


def parse_manifest(data: Any, *, base_dir: str | Path | None = None, source: str | None = None) -> Manifest:
    """Validate an already-loaded manifest mapping."""
    if not isinstance(data, dict):
        raise ManifestError([f"(top level): expected a mapping, got {type(data).__name__}"], source)
    problems = non_finite_problems(data)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_merged(problems, format_validation_error(exc)), source) from None
    if problems:
        raise ManifestError(problems, source)
    manifest._base_dir = Path(base_dir).resolve() if base_dir else Path.cwd()
    return manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a YAML manifest; relative paths in it resolve from its folder."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(
                [f"(file): {size:,} bytes; a manifest is at most {MAX_MANIFEST_BYTES:,} bytes"], str(path)
            )
        text = path.read_text()
    except OSError as exc:
        raise ManifestError([f"cannot read {path}: {exc.strerror or exc}"], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError([f"not valid YAML: {exc}"], str(path)) from None
    problem = _expansion_problem(data)
    if problem:
        raise ManifestError([problem], str(path))
    return parse_manifest(data, base_dir=path.parent, source=str(path))


def non_finite_problems(data: Any, prefix: str = "") -> list[str]:
    """One ``path: ...`` line per NaN or infinity anywhere in a manifest's values, typed or not
    (a judge's ``config``, ``env_config``, the algorithm's options): no value a run reads may be
    one (``score_range: [0, .nan]`` would score every judgement 0)."""
    problems: list[str] = []
    seen: set[int] = set()
    pending: list[tuple[str, Any]] = [(prefix, data)]
    while pending and len(problems) < 20:
        path, node = pending.pop()
        if isinstance(node, float) and not math.isfinite(node):
            shown = "nan" if node != node else ("inf" if node > 0 else "-inf")
            problems.append(f"{path or '(top level)'}: {shown} is not a finite number; give a number (YAML .nan/.inf are refused)")
        elif isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))  # an alias is checked once
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in reversed(list(items)):
                child = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else str(key)
                pending.append((child, value))
    return problems


def _merged(first: list[str], then: list[str]) -> list[str]:
    """``first``, then the lines of ``then`` about other paths (one line per path)."""
    paths = {line.split(": ", 1)[0] for line in first}
    return first + [line for line in then if line.split(": ", 1)[0] not in paths]


def _expansion_problem(data: Any) -> str | None:
    """Why ``data`` is too big once its YAML aliases are expanded (or loops back on itself).

    Counted over the shared nodes once each, so a billion-value alias bomb costs microseconds.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def expanded(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in open_nodes:
            raise RecursionError
        if key not in sizes:
            open_nodes.add(key)
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            sizes[key] = 1 + sum(expanded(child) for child in children)
            open_nodes.discard(key)
        return sizes[key]

    try:
        total = expanded(data)
    except RecursionError:
        return "(file): an alias refers to itself, so the manifest never ends; remove the loop"
    if total > MAX_MANIFEST_VALUES:
        return (
            f"(file): expands to {total:,} values (YAML aliases, '*name', repeat their anchor's "
            f"content); a manifest holds at most {MAX_MANIFEST_VALUES:,}"
        )
    return None


_ENVIRONMENT_SECTION: TypeAdapter[EnvironmentSpec] = TypeAdapter(EnvironmentSection)


def parse_env_spec(data: dict[str, Any]) -> EnvironmentSpec:
    """Validate an ``environment:`` mapping on its own, as the variant its source picks."""
    problems = non_finite_problems(data, "environment")
    try:
        spec = _ENVIRONMENT_SECTION.validate_python(data)
    except ValidationError as exc:
        raise ConfigError(_merged(problems, format_validation_error(exc, "environment")), "environment settings") from None
    if problems:
        raise ConfigError(problems, "environment settings")
    return spec
