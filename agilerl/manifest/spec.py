"""The manifest: every external input is parsed here, once, into pydantic models.

``environment:`` is the env spec; ``model:``, ``algorithm:`` and ``training:`` are read by the
training loops. Errors name the field path, the value and the fix.
"""

from __future__ import annotations

import difflib
import warnings
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from agilerl.errors import ConfigError, ManifestError
from agilerl.manifest.requirements import check_requirement
from agilerl.manifest.settings import (
    AlgorithmSettings,
    GenerationSettings,
    ManifestModel,
    ModelSettings,
    TrainingSettings,
)

Requirement = Annotated[str, AfterValidator(check_requirement)]
"""A requirement name with optional extras, specifiers and markers (``check_requirement``)."""

MAX_TURNS = 10_000
"""A turn budget past this is a typo (each turn is a generation and an env call)."""
MAX_MANIFEST_BYTES = 1_000_000
MAX_MANIFEST_VALUES = 100_000
"""A manifest is a few dozen values; YAML aliases can make a few hundred bytes expand to billions."""


class ManifestWarning(UserWarning):
    """Something in a manifest is ignored."""


_RETIRED_ENV_TYPES = {
    "multiturn": "env_type 'multiturn' is retired: use 'env_type: rollout'.",
    "reasoning": "env_type 'reasoning' is retired: use 'env_type: rollout' with 'max_turns: 1'.",
    "sft": "env_type 'sft' is retired: use 'env_type: dataset' with 'objective: sft'.",
    "preference": (
        "env_type 'preference' is retired: use 'env_type: dataset' with 'objective: preference'."
    ),
}


class _Section(ManifestModel):
    """A manifest section: aliases accepted, unknown keys ignored with one warning (or, where
    ``_unknown_is_error``, refused)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _warn_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            known |= {f.alias for f in cls.model_fields.values() if f.alias}
            unknown = sorted(str(k) for k in data if k not in known and not cls._is_extension(k))
            if unknown:
                named = ", ".join(_with_suggestion(key, known, cls._moved_keys) for key in unknown)
                if cls._unknown_is_error:
                    raise ValueError(
                        f"unknown {cls._section_name()} key(s): {named}; the keys are: "
                        f"{', '.join(sorted(cls.model_fields))} (and x-... keys, for YAML anchors)"
                    )
                warnings.warn(
                    f"{cls._section_name()}: ignoring unknown key(s): {named}",
                    ManifestWarning,
                    stacklevel=2,
                )
        return data

    _moved_keys: ClassVar[dict[str, str]] = {}
    """Keys people put in this section that belong elsewhere -> where they belong."""
    _unknown_is_error: ClassVar[bool] = False

    @classmethod
    def _is_extension(cls, key: Any) -> bool:
        """Keys this section ignores without a word (none; the manifest's ``x-`` keys)."""
        return False

    @classmethod
    def _section_name(cls) -> str:
        return cls.__name__


def _with_suggestion(key: str, known: set[str], moved: dict[str, str]) -> str:
    """``key``, plus "(did you mean 'x'?)" when it is a typo of a real field or a moved key."""
    close = difflib.get_close_matches(key, sorted(known | set(moved)), n=1, cutoff=0.8)
    return f"{key} (did you mean {moved.get(close[0], close[0])!r}?)" if close else key


class EnvPackages(BaseModel):
    """Packages installed (with uv) when the entrypoint cannot be imported."""

    model_config = ConfigDict(extra="forbid")

    uv: list[Requirement] | None = None
    pip: list[Requirement] | None = None

    @model_validator(mode="after")
    def _one_installer(self) -> EnvPackages:
        if (self.uv is None) == (self.pip is None):
            raise ValueError("env_packages takes exactly one of 'uv: [...]' or 'pip: [...]'.")
        return self

    @property
    def packages(self) -> list[str]:
        return list(self.uv if self.uv is not None else self.pip or [])


class EnvironmentSpec(_Section):
    """The ``environment:`` section of a manifest."""

    _moved_keys: ClassVar[dict[str, str]] = {"system_prompt": "env_config: {system_prompt: ...}"}

    env_type: Literal["rollout", "dataset"] = Field(
        description="'rollout' (the model acts, the env answers) or 'dataset' (SFT/DPO data)."
    )
    dataset: str | None = Field(
        None, alias="name", description="HuggingFace id, Parquet/JSONL/CSV path or saved folder."
    )
    columns: dict[str, str] | None = Field(None, description="Rename source columns: {src: dst}.")
    rubric_file_path: str | None = Field(
        None, alias="reward_file_path", description="Python file holding the rubric."
    )
    rubric_name: str | None = Field(
        None, alias="reward_fn_name", description="Rubric: function in the file, or registered."
    )
    prompt_template: dict[str, str] | None = Field(
        None, description="Chat pieces such as system_0, user_1 with {column} placeholders."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the tokenizer's chat template."
    )
    train_test_split: float = Field(0.9, gt=0, lt=1, description="Train fraction, in (0, 1).")
    max_reward: float | None = Field(None, gt=0, description="Accuracy is reward / max_reward.")
    entrypoint: str | None = Field(
        None, description="Registered env name, 'module:attr' or 'path/to/file.py:attr'."
    )
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env factory."
    )
    env_packages: EnvPackages | None = Field(
        None, description="{uv: [...]} or {pip: [...]}: installed if the entrypoint is missing."
    )
    max_turns: int | None = Field(
        None,
        ge=1,
        le=MAX_TURNS,
        description="Turn budget; when left out, the env's max_turns (a remote env's, from the "
        "server's /metadata).",
    )
    env_url: str | list[str] | None = Field(
        None, description="URL (or list of replica URLs) of a remote OpenEnv-protocol server."
    )
    mcp_tool: str | None = Field(
        None, description="With env_url or an OpenEnv MCP entrypoint: step through this MCP tool."
    )
    action_field: str = Field(
        "message", description="Action field (or MCP tool argument) the model's text goes in."
    )
    observation_field: str | None = Field(
        None, description="Dotted path of the text in an observation (env_url or OpenEnv entrypoint)."
    )
    observation_processor: str | None = Field(
        None, description="Processor turning an observation (env_url or OpenEnv entrypoint) into text."
    )
    action_type: str | None = Field(
        None, description="OpenEnv entrypoint: 'module:attr' of its Action class, when nothing names it."
    )
    request_timeout_s: float = Field(
        300, ge=0, description="Bound on each remote message, seconds (0 disables)."
    )
    reconnect_timeout_s: float = Field(
        120,
        ge=0,
        description="How long a remote env may stay down (reconnecting with backoff) before the "
        "run stops, seconds.",
    )
    objective: Literal["sft", "preference"] | None = Field(
        None, description="For env_type 'dataset': 'sft' or 'preference'."
    )
    response_column: str = Field("response", description="SFT target column.")

    @classmethod
    def _section_name(cls) -> str:
        return "environment"

    @model_validator(mode="before")
    @classmethod
    def _env_type_given(cls, data: Any) -> Any:
        """A missing env_type gets the line to add, not pydantic's bare 'Field required'."""
        if isinstance(data, dict) and "env_type" not in data:
            guess = "dataset" if data.get("objective") else "rollout"
            raise ValueError(
                f"'env_type' is required: add 'env_type: {guess}' ('rollout': the model acts and "
                "an env answers; 'dataset': SFT or preference data, with 'objective')."
            )
        return data

    @field_validator("env_type", mode="before")
    @classmethod
    def _retired_env_types(cls, value: Any) -> Any:
        if isinstance(value, str) and value in _RETIRED_ENV_TYPES:
            raise ValueError(_RETIRED_ENV_TYPES[value])
        return value

    @model_validator(mode="after")
    def _rules(self) -> EnvironmentSpec:
        if self.env_type == "dataset":
            if self.objective is None:
                raise ValueError("env_type 'dataset' requires 'objective: sft' or 'objective: preference'.")
            if not self.dataset:
                raise ValueError("env_type 'dataset' requires 'dataset' (a HuggingFace id or a file).")
        else:
            if self.objective is not None:
                raise ValueError(
                    "'objective' applies to env_type 'dataset' only; remove it for 'rollout'."
                )
            sources = [k for k in ("dataset", "entrypoint", "env_url") if getattr(self, k)]
            if len(sources) != 1:
                got = ", ".join(sources) if sources else "none"
                raise ValueError(
                    "a rollout names exactly one source: 'dataset' (with a rubric), "
                    f"'entrypoint' or 'env_url' (got: {got})."
                )
            if self.dataset and not self.rubric_name:
                raise ValueError(
                    "a dataset rollout needs 'rubric_name' (a function in 'rubric_file_path', "
                    "or a registered rubric)."
                )
        if self.env_packages and not self.entrypoint:
            raise ValueError(
                "'env_packages' applies only with 'entrypoint': they are installed when the "
                "entrypoint cannot be found."
            )
        if self.env_url and self.env_config:
            raise ValueError(
                "'env_config' does not reach a remote env ('env_url'): configure the env where it "
                "is served, e.g. agilerl serve ENTRYPOINT --env-config '{...}'."
            )
        if self.action_type and not self.entrypoint:
            raise ValueError("'action_type' applies only with an OpenEnv 'entrypoint'.")
        if self.mcp_tool and not (self.env_url or self.entrypoint):
            raise ValueError("'mcp_tool' applies only with 'env_url' or an OpenEnv MCP 'entrypoint'.")
        if self.observation_field and self.observation_processor:
            raise ValueError(
                "'observation_field' and 'observation_processor' exclude each other; keep one."
            )
        return self

    @property
    def env_urls(self) -> list[str]:
        """``env_url`` as a list (one entry per replica)."""
        if self.env_url is None:
            return []
        return [self.env_url] if isinstance(self.env_url, str) else list(self.env_url)


class Manifest(_Section):
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

    environment: EnvironmentSpec
    model: ModelSettings = Field(default_factory=ModelSettings)
    algorithm: AlgorithmSettings = Field(default_factory=AlgorithmSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

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
    """One ``field.path: message (got value)`` line per pydantic error."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = ".".join(p for p in (prefix, loc) if p) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        got = ""
        if err["type"] not in ("missing", "value_error") and "input" in err:
            got = f" (got {err['input']!r})"
        lines.append(f"{path}: {msg}{got}")
    return lines


def parse_manifest(data: Any, *, base_dir: str | Path | None = None, source: str | None = None) -> Manifest:
    """Validate an already-loaded manifest mapping."""
    if not isinstance(data, dict):
        raise ManifestError([f"(top level): expected a mapping, got {type(data).__name__}"], source)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(format_validation_error(exc), source) from None
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


def parse_env_spec(data: dict[str, Any]) -> EnvironmentSpec:
    """Validate an ``environment:`` mapping on its own."""
    try:
        return EnvironmentSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "environment"), "environment settings") from None
