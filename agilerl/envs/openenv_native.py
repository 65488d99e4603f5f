"""OpenEnv's own environments (``openenv.core.env_server.interfaces.Environment``) as text envs.

An OpenEnv env takes its own pydantic ``Action`` and returns an ``Observation`` with ``done``,
``reward`` and env-specific fields. :class:`OpenEnvTextEnv` puts the model's text into one field
of that Action (``action_field``; a field that is not ``str`` reads it as JSON, an Enum by name:
``agilerl.envs.action_text``), or into one MCP tool's argument (``mcp_tool``), and reads the
observation's text exactly as ``RemoteEnvClient`` reads a served one (``agilerl.envs.observations``).

Nothing here imports openenv: an env object can only exist once its module imported openenv, so
classes are recognised by the names in their MRO, and openenv's types are imported from an env
already built.
"""

from __future__ import annotations

import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any

from agilerl.envs.action_text import ActionText
from agilerl.envs.observations import ObservationProcessor, make_observation_reader
from agilerl.envs.openenv_rubrics import RubricRecorder, is_openenv_rubric
from agilerl.envs.openenv_types import ACTION, ENVIRONMENT, MCP_ENVIRONMENT, has_base
from agilerl.errors import OpenEnvAdapterError
from agilerl.protocol import declared_members, member_problem

__all__ = [
    "ADAPTER_OPTIONS",
    "DEFAULT_ACTION_FIELD",
    "is_openenv_environment",
    "is_mcp_environment",
    "find_action_type",
    "choose_action_field",
    "text_action",
    "check_options",
    "observation_payload",
    "OpenEnvTextEnv",
    "AcceptedKeywords",
    "adapt_openenv",
]

_NOT_TEXT = ("reward", "done", "metadata")
"""Observation fields that are not its content (what openenv's server leaves out too)."""

ADAPTER_OPTIONS = ("action_field", "observation_field", "observation_processor", "image_field", "mcp_tool", "action_type")
"""How the adapter reads and writes text: the manifest's top-level fields, never ``env_config``
(which holds the env's own constructor arguments)."""

DEFAULT_ACTION_FIELD = "message"


def is_openenv_environment(obj: Any) -> bool:
    """True for an OpenEnv ``Environment`` subclass or instance; never imports openenv."""
    return has_base(obj, ENVIRONMENT)


def is_mcp_environment(obj: Any) -> bool:
    """True for an OpenEnv ``MCPEnvironment`` subclass or instance."""
    return has_base(obj, MCP_ENVIRONMENT)


def _is_specific_action(value: Any) -> bool:
    return isinstance(value, type) and has_base(value, ACTION) and (value.__module__, value.__name__) != ACTION


def find_action_type(env_cls: type) -> type | None:
    """The env's own Action class: ``step``'s annotation, else the ``Environment[Act, Obs, State]``
    type argument, else the one Action subclass the env's module holds; None when none names one
    (openenv's server would need ``action_cls``)."""
    step = getattr(env_cls, "step", None)
    params = list(inspect.signature(step).parameters.values())[1:2] if callable(step) else []
    annotation = params[0].annotation if params else None
    if params:
        try:  # a string annotation (from __future__ import annotations) names the class
            annotation = typing.get_type_hints(step).get(params[0].name, annotation)
        except Exception:  # noqa: BLE001 - unresolvable forward references: keep the raw one
            pass
    if _is_specific_action(annotation):
        return annotation  # type: ignore[return-value]
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and _is_specific_action(args[0]) and is_openenv_environment(typing.get_origin(base)):
                return args[0]  # type: ignore[no-any-return]
    # OpenEnv's own envs often annotate ``step(self, action: Action)`` (the base class, or a Union
    # with openenv's MCP actions) and import their one Action from ``..models``: the env's module
    # then holds exactly one that openenv does not define.
    module = sys.modules.get(env_cls.__module__)
    found = {
        id(v): v for v in vars(module).values() if _is_specific_action(v) and not v.__module__.startswith("openenv.")
    } if module else {}
    return next(iter(found.values())) if len(found) == 1 else None


def choose_action_field(action_type: type, requested: str | None) -> str | None:
    """The Action field the text fills: ``requested``; by default ``message``, else the Action's
    one required field, else its one field. None when no one field can take the text (several
    fields, or several required): the text is then a JSON object of the Action's fields
    (``agilerl.envs.action_text``). A requested field that cannot take it alone is an error."""
    fields = getattr(action_type, "model_fields", {})
    own = {name: info for name, info in fields.items() if name != "metadata"}
    listing = ", ".join(own) or "none"
    required = [name for name, info in own.items() if info.is_required()]
    if requested and requested in own:
        others = [name for name in required if name != requested]
        if others:
            raise OpenEnvAdapterError(
                f"{action_type.__name__} also requires {', '.join(others)}, but the model's text fills "
                f"one field ({requested!r}); give them defaults, or write a small text env around this one."
            )
        return requested
    if requested not in (None, DEFAULT_ACTION_FIELD):
        raise OpenEnvAdapterError(
            f"action_field {requested!r}: {action_type.__name__} has no such field (its fields: "
            f"{listing}); set action_field to one of them."
        )
    if DEFAULT_ACTION_FIELD in own and required in ([], [DEFAULT_ACTION_FIELD]):
        return DEFAULT_ACTION_FIELD
    candidates = required if required else list(own)
    return candidates[0] if len(candidates) == 1 else None


def text_action(
    env_cls: type, action_type: type | None = None, action_field: str | None = None
) -> tuple[type, str | None]:
    """The Action class the text becomes and the field it fills (None: the text is a JSON object
    of the Action's fields); an error says what to set."""
    found = action_type or find_action_type(env_cls)
    if found is None:
        raise OpenEnvAdapterError(
            f"cannot tell {env_cls.__name__}'s Action type: annotate step's action "
            "(def step(self, action: MyAction, ...)), subclass Environment[MyAction, MyObservation, "
            "MyState], or set action_type."
        )
    return found, choose_action_field(found, action_field)


def check_options(env_cls: type, options: dict[str, Any]) -> None:
    """Fail early, on the class, for options no instance of it could use."""
    if is_mcp_environment(env_cls):
        return
    if options.get("mcp_tool"):
        raise OpenEnvAdapterError(
            f"mcp_tool {options['mcp_tool']!r}: {env_cls.__name__} is not an MCPEnvironment, it has no tools."
        )
    text_action(env_cls, options.get("action_type"), options.get("action_field"))


def observation_payload(observation: Any) -> dict[str, Any]:
    """An Observation's content as JSON data, as openenv's server sends it (no reward/done/metadata)."""
    if isinstance(observation, dict):
        return {k: v for k, v in observation.items() if k not in _NOT_TEXT}
    try:
        return dict(observation.model_dump(mode="json", exclude=set(_NOT_TEXT)))
    except Exception:  # noqa: BLE001 - a field JSON cannot hold: keep the python values
        return dict(observation.model_dump(exclude=set(_NOT_TEXT)))


class OpenEnvTextEnv:
    """An OpenEnv env behind the text-env protocol: ``reset -> (prompt, info)``, ``step(text)``.

    ``reward`` (None reads as 0.0) and ``done`` (``terminated``) come from each Observation, its
    ``metadata`` is the info dict, and ``close()`` reaches the env once.
    """

    def __init__(
        self,
        env: Any,
        *,
        action_field: str | None = None,
        observation_field: str | None = None,
        observation_processor: str | ObservationProcessor | None = None,
        mcp_tool: str | None = None,
        action_type: type | None = None,
        base_dir: str | Path | None = None,
        image_field: str | None = None,
    ) -> None:
        if isinstance(env, type):
            env = env()
        if not is_openenv_environment(env):
            raise OpenEnvAdapterError(
                f"{type(env).__name__} is not an OpenEnv Environment (openenv.core.env_server."
                "interfaces.Environment); a text env needs no adapter."
            )
        self.env = env
        self._recorder: RubricRecorder | None = None  # the env's own OpenEnv rubric's, once it steps
        self.mcp = is_mcp_environment(env)
        self._read = make_observation_reader(
            observation_field, observation_processor, base_dir=base_dir, image_field=image_field
        )
        self._closed = False
        self._fillers: dict[str, ActionText] = {}
        self._mcp_resolved: tuple[str, str, bool] | None = None
        if self.mcp:
            self.mcp_tool = mcp_tool
            self.action_type: type | None = None
            self.action_field = action_field
        else:
            if mcp_tool:
                raise OpenEnvAdapterError(
                    f"mcp_tool {mcp_tool!r}: {type(env).__name__} is not an MCPEnvironment, it has no tools."
                )
            self.action_type, self.action_field = text_action(type(env), action_type, action_field)
            own = [name for name in self.action_type.model_fields if name != "metadata"]  # type: ignore[attr-defined]
            # an Action with more than the text's field also takes a JSON object of its fields,
            # unless action_field says where the text goes
            self._text = ActionText(self.action_type, self.action_field, whole=not action_field and len(own) > 1)
        max_turns = declared_members(env)["max_turns"]
        if max_turns is not None and member_problem("max_turns", max_turns) is None:
            self.max_turns = max_turns  # the OpenEnv env's own budget, declared by its adapter

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        """Start an episode: the first observation's text, and its metadata as info.

        ``reset`` gets only the keywords it accepts, as openenv's server passes them:
        ``reset(self)`` and ``reset(self, fen=None)`` are both OpenEnv envs."""
        given = {"seed": seed, "episode_id": episode_id, **kwargs}
        observation = self.env.reset(**AcceptedKeywords(self.env.reset)(given))
        return self._read(observation_payload(observation)), _info(observation)

    @property
    def takes_seed(self) -> bool:
        """Whether the env's ``reset`` accepts a seed (OpenEnv does not require one)."""
        return "seed" in AcceptedKeywords(self.env.reset)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send the model's text as the env's own Action (or one MCP tool call)."""
        return self._result(*self._env_step(self._action(action)))

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One parsed tool call as the MCP env's ``CallToolAction`` (``environment.tool_parser``)."""
        if not self.mcp:
            raise OpenEnvAdapterError(f"{type(self.env).__name__} is not an MCPEnvironment, it has no tools.")
        from openenv.core.env_server.mcp_types import CallToolAction

        return self._result(*self._env_step(CallToolAction(tool_name=name, arguments=dict(arguments))))

    def list_tools(self) -> list[dict[str, Any]] | None:
        """The MCP env's tools (``ListToolsAction``) as JSON-schema tool specs; None for other envs."""
        if not self.mcp:
            return None
        from openenv.core.env_server.mcp_types import ListToolsAction

        tools = getattr(self.env.step(ListToolsAction()), "tools", None) or []
        return [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]

    def _env_step(self, action: Any) -> tuple[Any, dict[str, float]]:
        """``env.step(action)``, and the scores the named parts of the env's own OpenEnv
        ``rubric`` (RFC 004) gave in it: each is a reward component (``reward/<name>``)."""
        rubric = getattr(self.env, "rubric", None)
        if not is_openenv_rubric(rubric):
            return self.env.step(action), {}
        if self._recorder is None or self._recorder.rubric is not rubric:
            self._recorder = RubricRecorder(rubric)
        with self._recorder.recording() as scores:
            observation = self.env.step(action)
        return observation, self._recorder.components(scores)

    def _result(self, observation: Any, components: dict[str, float] | None = None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward = getattr(observation, "reward", None)
        truncated = getattr(observation, "truncated", False)
        info = _info(observation)
        if components:
            info["reward_components"] = {**components, **info.get("reward_components", {})}
        return (
            self._read(observation_payload(observation)),
            0.0 if reward is None else float(reward),
            bool(getattr(observation, "done", False)),
            truncated if isinstance(truncated, bool) else False,
            info,
        )

    def state(self) -> dict[str, Any]:
        """The env's ``State`` as a dict."""
        state = getattr(self.env, "state", None)
        state = state() if callable(state) else state
        return dict(state.model_dump()) if hasattr(state, "model_dump") else dict(state or {})

    def close(self) -> None:
        """Close the OpenEnv env exactly once."""
        if self._closed:
            return
        self._closed = True
        self.env.close()

    def _action(self, text: str) -> Any:
        if self.mcp:
            from openenv.core.env_server.mcp_types import CallToolAction

            tool, field, as_text = self._mcp_target()
            return CallToolAction(tool_name=tool, arguments={field: text if as_text else _json_or_text(text)})
        return self.action(text)

    def action(self, text: str, field: str | None = None) -> Any:
        """The env's own Action for the model's text, into ``field`` when given (a served client's
        ``{field: text}``), else where the adapter puts it; which text fills which field type:
        ``agilerl.envs.action_text``."""
        if self.mcp or self.action_type is None:
            raise OpenEnvAdapterError(f"{type(self.env).__name__} is an MCP env: its text goes to a tool, not an Action.")
        if field is None or field == self.action_field:
            return self._text(text)
        filler = self._fillers.get(field)
        if filler is None:
            filler = self._fillers[field] = ActionText(self.action_type, choose_action_field(self.action_type, field))
        return filler(text)

    def _mcp_target(self) -> tuple[str, str, bool]:
        """The tool and its argument (as configured, else the env's only tool and its only required
        one), and whether the argument takes text as it is: one that is not a string in the tool's
        input schema reads the text as JSON, as an Action's field does. Listed once, then kept."""
        if self._mcp_resolved is not None:
            return self._mcp_resolved
        from openenv.core.env_server.mcp_types import ListToolsAction

        tools = {t.name: t for t in getattr(self.env.step(ListToolsAction()), "tools", [])}
        if self.mcp_tool is None:
            if len(tools) != 1:
                raise OpenEnvAdapterError(
                    f"{type(self.env).__name__} is an MCP env with tools {', '.join(tools) or 'none'}; "
                    "set mcp_tool to the one the model's text goes to."
                )
            self.mcp_tool = next(iter(tools))
        tool = tools.get(self.mcp_tool)
        if tool is None:
            raise OpenEnvAdapterError(
                f"mcp_tool {self.mcp_tool!r}: {type(self.env).__name__} has no such tool "
                f"(its tools: {', '.join(tools) or 'none'})."
            )
        if self.action_field is None:
            schema = getattr(tool, "input_schema", None) or {}
            params = list(schema.get("properties", {}))
            required = schema.get("required", params)
            if DEFAULT_ACTION_FIELD in params:
                self.action_field = DEFAULT_ACTION_FIELD
            elif len(required) == 1:
                self.action_field = required[0]
            else:
                raise OpenEnvAdapterError(
                    f"tool {self.mcp_tool!r} takes {', '.join(params) or 'no arguments'}; set "
                    "action_field to the argument the model's text fills."
                )
        argument = ((getattr(tool, "input_schema", None) or {}).get("properties") or {}).get(self.action_field, {})
        self._mcp_resolved = (self.mcp_tool, self.action_field, _takes_text(argument))
        return self._mcp_resolved


def _takes_text(schema: Any) -> bool:
    """Whether a JSON Schema admits a string (or says nothing of its type): the text goes as it is."""
    if not isinstance(schema, dict):
        return True
    kind = schema.get("type")
    if kind is not None:
        return kind == "string" or (isinstance(kind, list) and "string" in kind)
    variants = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(variants, list) and variants:
        return any(_takes_text(v) for v in variants)
    return not any(k in schema for k in ("enum", "const", "properties", "items"))


def _json_or_text(text: str) -> Any:
    """The text's JSON value, or the text itself when it is not JSON (the tool says what it takes)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


class AcceptedKeywords:
    """The keywords a callable accepts, read from its signature once: OpenEnv's server passes
    ``reset`` only those, so the adapter and our server's native host both filter with this."""

    def __init__(self, method: Any) -> None:
        params = inspect.signature(method).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self.names: frozenset[str] | None = None if takes_any else frozenset(params)

    def __contains__(self, name: str) -> bool:
        return self.names is None or name in self.names

    def __call__(self, given: dict[str, Any]) -> dict[str, Any]:
        """The items of ``given`` the callable accepts (all of them when it takes ``**kwargs``)."""
        return dict(given) if self.names is None else {k: v for k, v in given.items() if k in self.names}


def _info(observation: Any) -> dict[str, Any]:
    metadata = getattr(observation, "metadata", None)
    return dict(metadata) if isinstance(metadata, dict) else {}


_NAMED: dict[type, type] = {}


def adapt_openenv(env: Any, **options: Any) -> OpenEnvTextEnv:
    """Wrap an OpenEnv env (class or instance) as a text env named and described like it (checks,
    logs and ``/metadata`` say ``WordEnv`` and its docstring, not ``OpenEnvTextEnv``'s)."""
    klass = env if isinstance(env, type) else type(env)
    named = _NAMED.get(klass)
    if named is None:
        # the env's own docstring describes it (``/metadata``'s description, as openenv's default
        # ``get_metadata`` says "<Name> environment" when there is none)
        doc = inspect.getdoc(klass) if klass.__doc__ else f"{klass.__name__} environment"
        named = _NAMED[klass] = type(klass.__name__, (OpenEnvTextEnv,), {"__module__": __name__, "__doc__": doc})
    return named(env, **options)  # type: ignore[no-any-return]
