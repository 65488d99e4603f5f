"""Hosting an OpenEnv-native env on ``/ws`` as openenv's own server does: the env's own fields.

A text env is served as text (``{"message": ...}`` in, ``{"text": ...}`` out). An OpenEnv env
(an :class:`~agilerl.envs.openenv_native.OpenEnvTextEnv` from the entrypoint) is served natively
instead, so openenv's ``GenericEnvClient`` sends the env's Action fields (``{"word": "kiwi"}``,
or an MCP ``{"type": "call_tool", ...}``) and gets the Observation's fields back, exactly as
``openenv.core.env_server.http_server`` answers. :class:`NativeSession` answers one session's
frames; :func:`native_schema` is its ``GET /schema``. Frames are built with ``agilerl.remote.frames``.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import ValidationError

from agilerl.concurrency import EnvCaller
from agilerl.envs.openenv_native import OpenEnvTextEnv, is_mcp_environment
from agilerl.remote.frames import ErrorCode, decode, encode, error_frame, state_frame

_NOT_CONTENT = {"reward", "done", "metadata"}


def hosts_natively(env: Any) -> bool:
    """True when ``env`` (what the server's factory built) is an OpenEnv env to host natively."""
    return isinstance(env, OpenEnvTextEnv)


def observation_reply(observation: Any) -> bytes:
    """An observation frame as openenv's ``serialize_observation`` writes it."""
    content = observation.model_dump(exclude=_NOT_CONTENT)
    return encode({"type": "observation", "data": {"observation": content, "reward": observation.reward, "done": observation.done}})


def native_schema(adapter: OpenEnvTextEnv) -> dict[str, Any]:
    """``GET /schema`` for a natively hosted env: its Action, Observation and State schemas."""
    env = adapter.env
    action = adapter.action_type
    if action is None:  # an MCP env takes openenv's tool-call action
        from openenv.core.env_server.mcp_types import CallToolAction

        action = CallToolAction
    hints = _return_hints(type(env))
    state = getattr(env, "state", None)
    return {
        "action": action.model_json_schema(),
        "observation": hints.model_json_schema() if hints is not None else {"type": "object"},
        "state": type(state).model_json_schema() if hasattr(state, "model_json_schema") else {"type": "object"},
    }


class NativeSession:
    """One WebSocket session's frames, answered by an OpenEnv env in its own terms.

    ``reply`` takes a raw client frame and returns the raw reply, or None for ``close``; env calls
    run through ``caller`` (worker threads), as text sessions' do.
    """

    def __init__(self, adapter: OpenEnvTextEnv, caller: EnvCaller) -> None:
        self.adapter = adapter
        self.env = adapter.env
        self.caller = caller

    async def reply(self, raw: str | bytes) -> bytes | None:
        try:
            frame = decode(raw)
        except ValueError as exc:
            return error_frame(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
        if not isinstance(frame, dict):
            return error_frame(ErrorCode.INVALID_JSON, "a frame is a JSON object")
        kind = frame.get("type")
        data = frame.get("data") or {}
        try:
            if kind == "reset":
                kwargs = _accepted(self.env.reset, data)
                return observation_reply(await self.caller.in_thread(self.env.reset, **kwargs))
            if kind == "step":
                action = self._action(data)
                return observation_reply(await self.caller.in_thread(self.env.step, action))
            if kind == "state":
                state = getattr(self.env, "state", None)
                return state_frame(state.model_dump() if hasattr(state, "model_dump") else dict(state or {}))
            if kind == "close":
                return None
            return error_frame(ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {kind}")
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False)
            return error_frame(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors)
        except Exception as exc:  # noqa: BLE001 - the env's failure is the client's error frame
            return error_frame(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")

    def _action(self, data: dict[str, Any]) -> Any:
        """The env's own Action from the frame's data; MCP ``call_tool``/``list_tools`` as openenv routes them."""
        if is_mcp_environment(self.env) and data.get("type") in ("call_tool", "list_tools"):
            from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

            mcp = CallToolAction if data["type"] == "call_tool" else ListToolsAction
            return mcp.model_validate(data)
        action = self.adapter.action_type
        if action is None:
            from openenv.core.env_server.mcp_types import CallToolAction

            action = CallToolAction
        return action.model_validate(data)


def _accepted(method: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``method`` accepts (all of them when it takes ``**kwargs``)."""
    params = inspect.signature(method).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(data)
    return {k: v for k, v in data.items() if k in params}


def _return_hints(env_cls: type) -> Any:
    try:
        import typing

        annotation = typing.get_type_hints(env_cls.reset).get("return")
    except Exception:  # noqa: BLE001 - unresolvable annotations: no schema
        return None
    return annotation if hasattr(annotation, "model_json_schema") else None
