"""The ``environment:`` section: flat YAML read as one of five variants, picked by its source.

An entrypoint (an env in this process), an env_url (a remote env), a dataset with a rubric (a
scored rollout), SFT/preference data, or an agent program (agent_command, or agent in process).
Each variant holds only the keys that apply to it, so a combination no run could use cannot be
built, and the error says where a misplaced key belongs.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from agilerl.manifest.requirements import check_requirement
from agilerl.manifest.rubrics import RubricEntrySpec, RubricGateSpec, check_rubric_entries
from agilerl.manifest.section import Section

__all__ = [
    "AgentSpec",
    "ENVIRONMENT_VARIANTS",
    "MAX_TURNS",
    "VARIANT_TAGS",
    "DatasetSpec",
    "EntrypointSpec",
    "EnvPackages",
    "EnvUrlSpec",
    "EnvironmentSection",
    "EnvironmentSpec",
    "RolloutSource",
    "RolloutSpec",
    "ScoredDatasetSpec",
]

Requirement = Annotated[str, AfterValidator(check_requirement)]
"""A requirement name with optional extras, specifiers and markers (``check_requirement``)."""

MAX_TURNS = 10_000
"""A turn budget past this is a typo (each turn is a generation and an env call)."""

_RETIRED_ENV_TYPES = {
    "multiturn": "env_type 'multiturn' is retired: use 'env_type: rollout'.",
    "reasoning": "env_type 'reasoning' is retired: use 'env_type: rollout' with 'max_turns: 1'.",
    "sft": "env_type 'sft' is retired: use 'env_type: dataset' with 'objective: sft'.",
    "preference": (
        "env_type 'preference' is retired: use 'env_type: dataset' with 'objective: preference'."
    ),
}


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


def _replica_count(value: Any) -> Any:
    """``replicas``: a whole number of servers, or ``auto``; one message for anything else."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024):
        return value
    raise ValueError(f"replicas takes a whole number from 1 to 1024, or 'auto' (got {value!r})")


class EnvironmentSpec(Section):
    """The ``environment:`` section: one of four variants, picked by its source (``EnvironmentSection``).

    A variant holds only the fields that apply to its source, so a combination no run could use
    cannot be built; code branches on the variant's type, never on which field is set.
    """

    _moved_keys: ClassVar[dict[str, str]] = {"system_prompt": "env_config: {system_prompt: ...}"}
    _kind: ClassVar[str]
    """How errors name this variant: "'key' applies to <another's _kind>; remove it for <_kind>"."""
    _required_hints: ClassVar[dict[str, str]] = {}
    """Required field -> the line to write when it is missing."""

    env_type: Literal["rollout", "dataset"] = Field(
        description="'rollout' (the model acts, the env answers) or 'dataset' (SFT/DPO data)."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the tokenizer's chat template."
    )

    @classmethod
    def _section_name(cls) -> str:
        return "environment"

    @classmethod
    def _misplaced(cls, key: str) -> str | None:
        """Why ``key``, a field of another variant, is refused here (None: not such a field)."""
        homes = [v for v in ENVIRONMENT_VARIANTS if key in v.model_fields or key in _aliases(v)]
        if not homes:
            return None
        return _MISPLACED.get(key) or (
            f"'{key}' applies to {' or '.join(v._kind for v in homes)}; remove it for {cls._kind}."
        )

    @model_validator(mode="before")
    @classmethod
    def _required_with_hint(cls, data: Any) -> Any:
        """A missing required field gets what to write, not pydantic's bare 'Field required'."""
        if cls not in ENVIRONMENT_VARIANTS:  # a shared base names no source: it is no environment
            raise TypeError(
                f"{cls.__name__} is a base of the environment variants; validate a mapping with "
                "parse_env_spec, or build one of: " + ", ".join(v.__name__ for v in ENVIRONMENT_VARIANTS)
            )
        if isinstance(data, dict):
            for key, hint in cls._required_hints.items():
                field = cls.model_fields[key]
                if data.get(key) is None and (field.alias is None or data.get(field.alias) is None):
                    raise ValueError(hint)
        return data


class RolloutSpec(EnvironmentSpec):
    """What every rollout takes, whichever its source: the model acts and an env answers."""

    env_type: Literal["rollout"] = Field(description="'rollout': the model acts, the env answers.")
    max_turns: int | None = Field(
        None,
        ge=1,
        le=MAX_TURNS,
        description="Turn budget; when left out, the env's max_turns (a remote env's, from the "
        "server's /metadata).",
    )
    max_reward: float | None = Field(None, gt=0, description="Accuracy is reward / max_reward.")
    request_timeout_s: float = Field(
        300, ge=0, description="Bound on each env call (each remote message), seconds (0 disables)."
    )
    context_policy: Literal["error", "truncate", "restart"] = Field(
        "error",
        description="When the conversation outgrows model.max_model_len: 'error' ends the episode there; "
        "'truncate' drops the oldest whole turns (keeps the system and first prompt); 'restart' opens a "
        "fresh context (the env's restart_prompt(history), else the first prompt and the newest turns). "
        "Both start a new training sample (docs/training.md).",
    )


class _TableFields(BaseModel):
    """A table of rows to roll out or train on, and how each row becomes a prompt."""

    dataset: str = Field(
        alias="name", min_length=1, description="HuggingFace id, Parquet/JSONL/CSV path or saved folder."
    )
    columns: dict[str, str] | None = Field(None, description="Rename source columns: {src: dst}.")
    prompt_template: dict[str, str] | None = Field(
        None, description="Chat pieces such as system_0, user_1 with {column} placeholders."
    )
    train_test_split: float = Field(0.9, gt=0, lt=1, description="Train fraction, in (0, 1).")
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="system_prompt, split_seed, subset, split."
    )


class _TextAdapterFields(BaseModel):
    """How the model's text becomes an OpenEnv action and an observation becomes text."""

    mcp_tool: str | None = Field(None, description="Step through this MCP tool.")
    tool_parser: str | None = Field(
        None,
        min_length=1,
        description="Parse the model's tool calls in its own format (a registered parser such as "
        "hermes, or auto) and run them as the env's call_tool; results come back in the tool role.",
    )
    send_reasoning: bool = Field(
        False, description="With tool_parser: the env also receives the model's reasoning (<think>, analysis)."
    )
    observation_field: str | None = Field(None, description="Dotted path of the text in an observation.")
    observation_processor: str | None = Field(
        None, description="Processor turning an observation into text."
    )
    image_field: str | None = Field(
        None,
        min_length=1,
        description="Dotted path of an observation's image (BrowserGym's screenshot, Atari's screen): "
        "nested pixels, flat pixels with <field>_shape, or base64 PNG/JPEG; shown to a vision model.",
    )

    @model_validator(mode="after")
    def _one_observation_reader(self) -> _TextAdapterFields:
        if self.observation_field and self.observation_processor:
            raise ValueError(
                "'observation_field' and 'observation_processor' exclude each other; keep one."
            )
        return self


class EntrypointSpec(_TextAdapterFields, RolloutSpec):
    """An env built in this process from a registered name, ``module:attr`` or ``file.py:attr``."""

    _kind: ClassVar[str] = "an 'entrypoint' env"

    entrypoint: str = Field(
        min_length=1, description="Registered env name, 'module:attr' or 'path/to/file.py:attr'."
    )
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env factory."
    )
    env_packages: EnvPackages | None = Field(
        None, description="{uv: [...]} or {pip: [...]}: installed if the entrypoint is missing."
    )
    action_field: str | None = Field(
        None,
        description="OpenEnv entrypoint: the Action field (or MCP tool argument) the model's text "
        "goes in; when left out, the adapter finds it.",
    )
    action_type: str | None = Field(
        None, description="OpenEnv entrypoint: 'module:attr' of its Action class, when nothing names it."
    )
    isolation: Literal["none", "venv"] = Field(
        "none",
        description="'none': the env (and its env_packages) lives in the trainer's interpreter; 'venv': "
        "in a uv venv of its own, cached by its resolved requirements, served on loopback "
        "(docs/env-fleets.md).",
    )
    provider: Literal["in_process", "local", "ray"] | None = Field(
        None,
        description="Where the env runs: 'in_process', 'local' (server processes on this machine) or "
        "'ray' (actors on a Ray cluster); default: 'local' with isolation: venv, else 'in_process'.",
    )
    replicas: Annotated[int | Literal["auto"], BeforeValidator(_replica_count)] = Field(
        1,
        description="Servers of the env (provider local or ray); 'auto' sizes them from the sessions "
        "the run needs.",
    )
    max_concurrent_envs: int | None = Field(
        None,
        ge=1,
        description="Sessions each replica serves at once (provider local or ray; default: the "
        "server's, 64).",
    )
    address: str | None = Field(
        None,
        min_length=1,
        description="provider ray: the Ray cluster ('ray://host:10001', 'host:6379', 'auto'); default: "
        "$RAY_ADDRESS, else a local cluster started and shut down with the run.",
    )
    max_starts_per_s: float = Field(
        4.0,
        gt=0,
        le=1000,
        description="Replica starts per second at most (provider local or ray; the first ones, "
        "replacements and growth, retries included).",
    )

    @model_validator(mode="after")
    def _fleet_options(self) -> EntrypointSpec:
        """``address`` is Ray's; ``max_starts_per_s`` any fleet's (not an in-process env's)."""
        if self.address is not None and self.placement != "ray":
            raise ValueError(
                f"'address' names a Ray cluster: it applies to provider 'ray' only (provider is "
                f"{self.placement!r}); set provider: ray, or remove it."
            )
        if "max_starts_per_s" in self.model_fields_set and self.placement == "in_process":
            raise ValueError(
                "'max_starts_per_s' applies to provider 'local' or 'ray' (servers of the env); "
                "set provider: local, or remove it."
            )
        return self

    @model_validator(mode="after")
    def _placement(self) -> EntrypointSpec:
        placement = self.placement
        if placement == "in_process":
            if self.isolation == "venv":
                raise ValueError(
                    "isolation 'venv' runs the env in a process of its own: provider 'in_process' "
                    "cannot hold it; use provider 'local' (or 'ray'), or leave provider out."
                )
            if self.replicas != 1 or self.max_concurrent_envs is not None:
                field = "replicas" if self.replicas != 1 else "max_concurrent_envs"
                raise ValueError(
                    f"'{field}' applies to provider 'local' or 'ray' (servers of the env); "
                    "set provider: local, or remove it."
                )
        return self

    @property
    def placement(self) -> str:
        """Where the env runs: ``provider``, or its default (``local`` with ``isolation: venv``)."""
        return self.provider or ("local" if self.isolation == "venv" else "in_process")


class EnvUrlSpec(_TextAdapterFields, RolloutSpec):
    """A remote env: one or several replicas of a server speaking OpenEnv's WebSocket protocol."""

    _kind: ClassVar[str] = "a remote env ('env_url')"

    env_url: str | list[str] = Field(
        min_length=1, description="URL (or list of replica URLs) of a remote OpenEnv-protocol server."
    )
    action_field: str = Field(
        "message", description="Action field (or MCP tool argument) the model's text goes in."
    )
    reconnect_timeout_s: float = Field(
        120,
        ge=0,
        description="How long a remote env may stay down (reconnecting with backoff) before the "
        "run stops, seconds.",
    )
    heartbeat_s: float = Field(
        20,
        ge=0,
        le=3600,
        description="Ping a remote env silent this long; a pong not back within half of it drops the "
        "session and replays the episode (a server gone without closing its socket), seconds (0 disables).",
    )

    @property
    def env_urls(self) -> list[str]:
        """``env_url`` as a list (one entry per replica)."""
        return [self.env_url] if isinstance(self.env_url, str) else list(self.env_url)


class ScoredDatasetSpec(_TableFields, RolloutSpec):
    """A dataset rollout: the model answers one row, a rubric (or weighted rubrics) scores it."""

    _kind: ClassVar[str] = "a dataset rollout ('dataset' with a rubric)"

    rubric_name: str | None = Field(
        None,
        alias="reward_fn_name",
        description="Rubric: function in the file, or registered (one entry of weight 1).",
    )
    rubric_file_path: str | None = Field(
        None, alias="reward_file_path", description="Python file holding the rubric."
    )
    rubrics: list[RubricEntrySpec] | None = Field(
        None, description="Weighted rubrics {name, rubric, weight, config}: the reward is their weighted sum."
    )
    rubric_gates: list[RubricGateSpec] = Field(
        default_factory=list,
        description="{component, min, zeroes}: zero the reward (or the entries named) unless a "
        "component reaches min.",
    )

    @model_validator(mode="after")
    def _one_reward(self) -> ScoredDatasetSpec:
        if (self.rubric_name is None) == (self.rubrics is None):
            raise ValueError(
                "a dataset rollout needs 'rubric_name' (a function in 'rubric_file_path', or a "
                "registered rubric) or 'rubrics: [{name, rubric, weight}]', not both."
                if self.rubric_name is not None
                else "a dataset rollout needs 'rubric_name' (a function in 'rubric_file_path', "
                "or a registered rubric) or 'rubrics: [{name, rubric, weight}]'."
            )
        if self.rubric_file_path is not None and self.rubrics is not None:
            raise ValueError(
                "'rubric_file_path' goes with 'rubric_name'; in 'rubrics:' write the file in each "
                "entry's rubric, as 'path/to/file.py:function'."
            )
        if self.rubric_gates and self.rubrics is None:
            raise ValueError(
                "'rubric_gates' gate the entries of 'rubrics:'; list the rubric there, e.g. "
                f"rubrics: [{{name: correct, rubric: {self.rubric_name}}}]."
            )
        check_rubric_entries([entry.name for entry in self.rubric_entries], self.rubric_gates)
        return self

    @property
    def rubric_entries(self) -> list[RubricEntrySpec]:
        """``rubrics:``, or ``rubric_name``/``rubric_file_path`` as its one entry of weight 1."""
        if self.rubrics is not None:
            return list(self.rubrics)
        assert self.rubric_name is not None
        ref = f"{self.rubric_file_path}:{self.rubric_name}" if self.rubric_file_path else self.rubric_name
        return [RubricEntrySpec(name="reward", rubric=ref)]


class DatasetSpec(_TableFields, EnvironmentSpec):
    """SFT or preference (DPO) data: nothing is generated, the rows are the batches."""

    _kind: ClassVar[str] = "env_type 'dataset'"
    _required_hints: ClassVar[dict[str, str]] = {
        "objective": "env_type 'dataset' requires 'objective: sft' or 'objective: preference'.",
        "dataset": "env_type 'dataset' requires 'dataset' (a HuggingFace id or a file).",
    }

    env_type: Literal["dataset"] = Field(description="'dataset': SFT or preference data.")
    objective: Literal["sft", "preference"] = Field(description="'sft' or 'preference'.")
    response_column: str = Field("response", description="SFT target column.")


class AgentSpec(EnvironmentSpec):
    """An agent program (``agent_command``) or Python function (``agent``) that plays whole
    episodes against the trainer's OpenAI-compatible endpoint (docs/agents.md)."""

    _kind: ClassVar[str] = "an agent program ('agent_command' or 'agent')"

    env_type: Literal["rollout"] = Field(description="'rollout': the model acts, the agent program drives.")
    max_turns: int | None = Field(
        None, ge=1, le=MAX_TURNS, description="Model calls one episode may make (later ones get 400); none: no bound."
    )
    max_reward: float | None = Field(None, gt=0, description="Accuracy is reward / max_reward.")

    agent_command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="The program run once per episode, as argv, in the manifest's folder (a leading python "
        "is the trainer's interpreter); it gets OPENAI_BASE_URL, OPENAI_API_KEY, AGILERL_TASK (and "
        "AGILERL_TASK_FILE) and AGILERL_EPISODE, and prints {\"reward\": r} last.",
    )
    agent: str | None = Field(
        None,
        min_length=1,
        description="In-process agent, 'path/to/file.py:fn' or 'module:fn': fn(task, base_url, api_key) "
        "-> reward, sync or async.",
    )
    dataset: str | None = Field(
        None,
        alias="name",
        min_length=1,
        description="The tasks (each row, as JSON, is one episode's task; a group shares a row): a "
        "HuggingFace id or a file. Left out: tasks are {seed: s}.",
    )
    columns: dict[str, str] | None = Field(None, description="With dataset: rename source columns: {src: dst}.")
    train_test_split: float = Field(0.9, gt=0, lt=1, description="With dataset: train fraction, in (0, 1).")
    env_config: dict[str, Any] = Field(
        default_factory=dict, description="With dataset: split_seed, subset, split."
    )
    rubrics: list[RubricEntrySpec] | None = Field(
        None, description="Score the final conversation of an episode whose agent prints no reward."
    )
    rubric_gates: list[RubricGateSpec] = Field(
        default_factory=list, description="{component, min, zeroes}, over the entries of 'rubrics'."
    )
    tool_parser: str | None = Field(
        None,
        min_length=1,
        description="Parse the model's tool calls (hermes, auto, ...) into the endpoint's OpenAI tool_calls.",
    )
    episode_timeout_s: float = Field(
        600, gt=0, description="An agent still running this long fails its episode (and is killed), seconds."
    )
    failure_score: float | None = Field(
        0.0,
        description="The reward of a failed episode (non-zero exit, no reward, timeout); null: the "
        "episode is lost instead.",
    )
    give_up_after_s: float = Field(
        300, gt=0, description="The run stops when every episode has failed this long, seconds."
    )
    max_concurrent_calls: int = Field(
        8, ge=1, le=1024, description="Calls one episode may have running at once (more get 429)."
    )
    max_request_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="The largest request body the endpoint reads (larger get 413)."
    )

    @model_validator(mode="after")
    def _one_agent_and_its_tasks(self) -> AgentSpec:
        if (self.agent_command is None) == (self.agent is None):
            raise ValueError(
                "an agent rollout takes exactly one of 'agent_command: [program, args...]' and "
                "'agent: path/to/file.py:fn'."
            )
        if self.dataset is None:
            given = [k for k in ("columns", "env_config", "train_test_split") if k in self.model_fields_set]
            if given:
                raise ValueError(
                    f"'{given[0]}' applies to an agent's task table; add 'dataset:' (the tasks) or remove it."
                )
        if self.rubric_gates and self.rubrics is None:
            raise ValueError("'rubric_gates' gate the entries of 'rubrics:'; list the rubrics there.")
        check_rubric_entries([entry.name for entry in self.rubric_entries], self.rubric_gates)
        return self

    @property
    def rubric_entries(self) -> list[RubricEntrySpec]:
        """``rubrics:`` (none: the agent must report its reward)."""
        return list(self.rubrics or [])


ENVIRONMENT_VARIANTS: tuple[type[EnvironmentSpec], ...] = (
    EntrypointSpec,
    EnvUrlSpec,
    ScoredDatasetSpec,
    DatasetSpec,
    AgentSpec,
)
"""The ``environment:`` variants, one per source."""

RolloutSource = Union[EntrypointSpec, EnvUrlSpec, ScoredDatasetSpec]  # noqa: UP007 - pydantic classes
"""A rollout's spec, whichever its source (what an env factory is made from)."""

_ROLLOUT_SOURCES: dict[str, type[EnvironmentSpec]] = {
    "dataset": ScoredDatasetSpec,
    "entrypoint": EntrypointSpec,
    "env_url": EnvUrlSpec,
    "agent_command": AgentSpec,
    "agent": AgentSpec,
}
"""The key that names a rollout's source -> its variant."""

_MISPLACED = {
    "objective": "'objective' applies to env_type 'dataset' only; remove it for 'rollout'.",
    "env_config": "'env_config' does not reach a remote env ('env_url'): configure the env where it "
    "is served, e.g. agilerl serve ENTRYPOINT --env-config '{...}'.",
    "env_packages": "'env_packages' applies only with 'entrypoint': they are installed when the "
    "entrypoint cannot be found.",
    "action_type": "'action_type' applies only with an OpenEnv 'entrypoint'.",
    "mcp_tool": "'mcp_tool' applies only with 'env_url' or an OpenEnv MCP 'entrypoint'.",
}
"""The fix for a key of another variant, where a bare "applies to ..." would not say it."""


def _aliases(model: type[BaseModel]) -> set[str]:
    return {f.alias for f in model.model_fields.values() if f.alias}


def _rollout_sources(data: dict[str, Any]) -> list[str]:
    """The source keys a rollout mapping sets (``name`` is ``dataset``'s alias)."""
    given = {("dataset" if key == "name" else key) for key, value in data.items() if value is not None}
    if given & {"agent", "agent_command"}:
        given.discard("dataset")  # an agent's dataset holds its tasks: not a source of its own
    return sorted(given & set(_ROLLOUT_SOURCES))


def _check_env_type_and_source(data: Any) -> Any:
    """Refuse, with the line to write, what no variant can take: a missing or retired env_type,
    a rollout with no source or two."""
    if not isinstance(data, dict):
        return data
    env_type = data.get("env_type")
    if env_type is None:
        guess = "dataset" if data.get("objective") else "rollout"
        raise ValueError(
            f"'env_type' is required: add 'env_type: {guess}' ('rollout': the model acts and "
            "an env answers; 'dataset': SFT or preference data, with 'objective')."
        )
    if env_type in _RETIRED_ENV_TYPES:
        raise ValueError(_RETIRED_ENV_TYPES[env_type])
    if env_type not in ("rollout", "dataset"):
        raise ValueError(f"env_type must be 'rollout' or 'dataset' (got {env_type!r}).")
    sources = _rollout_sources(data)
    if env_type == "rollout" and len(sources) != 1:
        raise ValueError(
            "a rollout names exactly one source: 'dataset' (with a rubric), "
            "'entrypoint', 'env_url', or an agent program ('agent_command' or 'agent') "
            f"(got: {', '.join(sources) or 'none'})."
        )
    return data


def _variant_tag(data: Any) -> str | None:
    """The variant a mapping (checked by ``_check_env_type_and_source``) or a spec is."""
    if isinstance(data, EnvironmentSpec):
        return type(data).__name__
    if not isinstance(data, dict):
        return None
    if data.get("env_type") == "dataset":
        return DatasetSpec.__name__
    (source,) = _rollout_sources(data)
    return _ROLLOUT_SOURCES[source].__name__


EnvironmentSection = Annotated[
    Union[  # noqa: UP007 - one member per line; a Tag names each for the discriminator
        Annotated[EntrypointSpec, Tag("EntrypointSpec")],
        Annotated[EnvUrlSpec, Tag("EnvUrlSpec")],
        Annotated[ScoredDatasetSpec, Tag("ScoredDatasetSpec")],
        Annotated[DatasetSpec, Tag("DatasetSpec")],
        Annotated[AgentSpec, Tag("AgentSpec")],
    ],
    Discriminator(
        _variant_tag,
        custom_error_type="environment_section",
        custom_error_message="expected a mapping with 'env_type' and the env's source",
    ),
    BeforeValidator(_check_env_type_and_source),
]
"""The ``environment:`` section as written: flat YAML, validated as the variant its source picks."""

VARIANT_TAGS = frozenset(variant.__name__ for variant in ENVIRONMENT_VARIANTS)
"""The discriminator's tags, which pydantic puts in an error's path and a user never wrote."""
