"""Hosting an OpenEnv-native env as openenv's own server does: the env's own fields, its own calls.

An OpenEnv env (an :class:`~agilerl.envs.openenv_native.OpenEnvTextEnv` from the entrypoint) is
served natively, so openenv's ``GenericEnvClient`` sends the env's Action fields (``{"word":
"kiwi"}``, or an MCP ``{"type": "call_tool", ...}``) and gets the Observation's fields back,
exactly as ``openenv.core.env_server.http_server`` answers:

- ``reset_async``/``step_async`` are awaited on the session's loop where the env overrides them
  (an ``MCPEnvironment`` does); otherwise ``reset``/``step`` run on the session's own thread;
- an MCP env's ``mcp_session()`` is held open for the whole session (one MCP client session per
  WebSocket session, not one per step);
- ``metadata`` stays off the wire (``serialize_observation`` leaves it out);
- a step whose data is one text (an agilerl client's ``{action_field: text}``) that does not
  validate as the Action is read as the model's text, as in process (``agilerl.envs.action_text``):
  an Action needs a text field only when text arrives;
- the ``mcp`` frame and ``POST /mcp`` answer JSON-RPC ``tools/list`` and ``tools/call``.

:class:`NativeSession` answers one session's frames; :func:`native_schema` is its ``GET /schema``.
"""

from __future__ import annotations

import contextlib
import typing
from typing import Any

from pydantic import ValidationError

from agilerl.concurrency import EnvCaller
from agilerl.envs.openenv_native import AcceptedKeywords, OpenEnvTextEnv, is_mcp_environment
from agilerl.errors import OpenEnvAdapterError, exception_text
from agilerl.remote.frames import (
    ErrorCode,
    RpcCode,
    decode,
    encode,
    error_frame,
    mcp_frame,
    parse_rpc,
    rpc_error,
    rpc_result,
    state_frame,
)

__all__ = ["hosts_natively", "observation_reply", "native_schema", "NativeSession"]

_NOT_CONTENT = {"reward", "done", "metadata"}
_ENVIRONMENT = ("openenv.core.env_server.interfaces", "Environment")


def hosts_natively(env: Any) -> bool:
    """True when ``env`` (what the server's factory built) is an OpenEnv env to host natively."""
    return isinstance(env, OpenEnvTextEnv)


def observation_reply(observation: Any) -> dict[str, Any]:
    """An observation frame as openenv's ``serialize_observation`` writes it."""
    content = observation.model_dump(exclude=_NOT_CONTENT)
    return {"type": "observation", "data": {"observation": content, "reward": observation.reward, "done": observation.done}}


def native_schema(adapter: OpenEnvTextEnv) -> dict[str, Any]:
    """``GET /schema`` for a natively hosted env: its Action, Observation and State schemas."""
    env = adapter.env
    state = getattr(env, "state", None)
    return {
        "action": _action_class(adapter).model_json_schema(),
        "observation": _observation_class(type(env)).model_json_schema(),
        "state": type(state).model_json_schema() if hasattr(state, "model_json_schema") else {"type": "object"},
    }


class NativeSession:
    """One WebSocket session's frames, answered by an OpenEnv env in its own terms.

    ``open()`` enters the env's ``mcp_session()`` (MCP envs) and ``close()`` leaves it, both on
    the session's task; ``reply`` takes a raw client frame and returns the reply, or None for
    ``close``. Sync env calls run through ``caller`` (the session's own thread).
    """

    def __init__(self, adapter: OpenEnvTextEnv, caller: EnvCaller) -> None:
        self.adapter = adapter
        self.env = env = adapter.env
        self.caller = caller
        self.action_type = _action_class(adapter)
        self.mcp_env = is_mcp_environment(env)
        base = next(c for c in type(env).__mro__ if (c.__module__, c.__name__) == _ENVIRONMENT)
        self.reset_async = type(env).reset_async is not base.reset_async
        self.step_async = type(env).step_async is not base.step_async
        self.reset_keywords = AcceptedKeywords(env.reset_async if self.reset_async else env.reset)
        self._held = contextlib.AsyncExitStack()

    async def open(self) -> None:
        factory = getattr(self.env, "mcp_session", None)
        if callable(factory):
            await self._held.enter_async_context(factory())

    async def close(self) -> None:
        await self._held.aclose()

    async def reply(self, raw: str | bytes) -> dict[str, Any] | None:
        try:
            frame = decode(raw)
        except ValueError as exc:
            return error_frame(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
        if not isinstance(frame, dict):
            return error_frame(ErrorCode.INVALID_JSON, "a frame is a JSON object")
        kind = frame.get("type")
        data = frame.get("data") or {}
        env = self.env
        try:
            if kind == "step":
                action = self._action(data)
                if self.step_async:
                    return observation_reply(await env.step_async(action))
                return observation_reply(await self.caller.in_thread(env.step, action))
            if kind == "reset":
                kwargs = self.reset_keywords(data)
                if self.reset_async:
                    return observation_reply(await env.reset_async(**kwargs))
                return observation_reply(await self.caller.in_thread(env.reset, **kwargs))
            if kind == "state":
                state = getattr(env, "state", None)
                return state_frame(state.model_dump() if hasattr(state, "model_dump") else dict(state or {}))
            if kind == "mcp":
                return mcp_frame(await self.mcp(data))
            if kind == "close":
                return None
            return error_frame(ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {kind}")
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False)
            return error_frame(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors)
        except OpenEnvAdapterError as exc:  # text that fits no reading of the Action
            return error_frame(ErrorCode.VALIDATION_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - the env's failure is the client's error frame
            return error_frame(ErrorCode.EXECUTION_ERROR, exception_text(exc))

    async def mcp(self, payload: Any) -> dict[str, Any]:
        """A JSON-RPC ``tools/list`` or ``tools/call``, through the session's MCP client."""
        request = parse_rpc(payload)
        if isinstance(request, dict):
            return request
        method, params, rid = request.method, request.params, request.id
        client = getattr(self.env, "mcp_client", None)
        if method not in ("tools/list", "tools/call"):
            return rpc_error(RpcCode.METHOD_NOT_FOUND, f"Method not found: {method}", rid)
        if client is None:
            return rpc_error(RpcCode.INTERNAL_ERROR, "Environment does not support MCP", rid)
        try:
            async with self.env.mcp_session():  # re-entrant: the session's own is already open
                if method == "tools/list":
                    tools = await client.list_tools()
                    return rpc_result({"tools": [_plain(t) for t in tools]}, rid)
                name = params.get("name")
                if not name:
                    return rpc_error(RpcCode.INVALID_PARAMS, "Missing 'name' in params", rid)
                result = await client.call_tool(name=name, arguments=params.get("arguments", {}))
                return rpc_result(decode(encode(result)), rid)
        except Exception as exc:  # noqa: BLE001 - the tool's failure is the client's error
            return rpc_error(RpcCode.INTERNAL_ERROR, str(exc), rid)

    def _action(self, data: dict[str, Any]) -> Any:
        """The env's own Action from the frame's data; MCP ``call_tool``/``list_tools`` as openenv routes them."""
        if self.mcp_env and data.get("type") in ("call_tool", "list_tools"):
            from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

            mcp = CallToolAction if data["type"] == "call_tool" else ListToolsAction
            return mcp.model_validate(data)
        try:
            return self.action_type.model_validate(data)
        except ValidationError:
            text = _text_of(data)
            if text is None or self.mcp_env:
                raise
        # one text in the frame (an agilerl client's {action_field: text}): read as in process
        key, value = text
        return self.adapter.action(value, key if key in self.action_type.model_fields else None)


def _text_of(data: dict[str, Any]) -> tuple[str, str] | None:
    """``(key, text)`` when the frame's data is one text (besides ``metadata``): the model's text
    sent by a text client, to be read into the Action's fields; None for anything else."""
    items = [(k, v) for k, v in data.items() if k != "metadata"]
    return items[0] if len(items) == 1 and isinstance(items[0][1], str) else None


def _plain(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else dict(value)


def _action_class(adapter: OpenEnvTextEnv) -> Any:
    """The env's Action class; an MCP env takes openenv's tool-call action."""
    if adapter.action_type is not None:
        return adapter.action_type
    from openenv.core.env_server.mcp_types import CallToolAction

    return CallToolAction


def _observation_class(env_cls: type) -> Any:
    """The env's Observation class, as openenv's ``create_app`` is given it: an MCP env's is
    ``CallToolObservation``; else ``reset``'s or ``step``'s return annotation, else the
    ``Environment[Act, Obs, State]`` argument; failing all, openenv's ``Observation``."""
    if is_mcp_environment(env_cls):
        from openenv.core.env_server.mcp_types import CallToolObservation

        return CallToolObservation
    for method in (env_cls.reset, env_cls.step):
        try:
            annotation = typing.get_type_hints(method).get("return")
        except Exception:  # noqa: BLE001 - unresolvable annotations: look further
            annotation = None
        if hasattr(annotation, "model_json_schema"):
            return annotation
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if len(args) > 1 and hasattr(args[1], "model_json_schema"):
                return args[1]
    from openenv.core.env_server.types import Observation

    return Observation
