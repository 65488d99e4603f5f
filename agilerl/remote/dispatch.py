"""Frame dispatch: one session's client frames answered by its env.

A text env is served as text (``{"message": ...}`` in, ``{"text": ...}`` out) through an
``InProcessEnvClient``, so its answers are checked by the same protocol rules as in-process
rollouts; an OpenEnv env is served in its own terms by ``openenv_host.NativeSession``. Both
answer ``reply(raw) -> frame | None`` (None: the client closed) and ``mcp(payload)`` (a JSON-RPC
request), and hold what the session needs open between ``open()`` and ``close()``. The HTTP
routes reuse them on a one-call session (``/reset``, ``/step``, ``/state``, ``/mcp``).
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from agilerl.concurrency import EnvCaller
from agilerl.envs.client import InProcessEnvClient
from agilerl.errors import exception_text
from agilerl.images import ImageLimits, ImageObservation
from agilerl.remote.frames import (
    ErrorCode,
    FrameError,
    RpcCode,
    error_frame,
    mcp_frame,
    observation_frame,
    parse_client_frame,
    parse_rpc,
    rpc_error,
    state_frame,
)
from agilerl.remote.openenv_host import NativeSession, hosts_natively
from agilerl.tools import ToolSet

__all__ = ["Session", "session_for", "TextSession"]


class Session(Protocol):
    """What a WebSocket (or one HTTP call) needs from its env."""

    async def open(self) -> None: ...

    async def reply(self, raw: str | bytes) -> dict[str, Any] | None: ...

    async def mcp(self, payload: Any) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def session_for(env: Any, caller: EnvCaller, *, with_info: bool, image_limits: ImageLimits | None = None) -> Session:
    """The dispatcher for ``env``: native for an OpenEnv env, text otherwise. ``with_info``: the
    client asked for each observation's info (``/ws?metadata=1``); ``image_limits``: what an
    observation's images may be before they are encoded for the wire."""
    if hosts_natively(env):
        return NativeSession(env, caller)
    return TextSession(env, caller, with_info=with_info, image_limits=image_limits)


class TextSession:
    """A text env's session: ``reset``/``step``/``state``/``close`` frames through its client."""

    def __init__(self, env: Any, caller: EnvCaller, *, with_info: bool, image_limits: ImageLimits | None = None) -> None:
        self.client = InProcessEnvClient(env, caller=caller)
        self._tools: ToolSet | None = None
        self.with_info = with_info
        self.image_limits = image_limits or ImageLimits(setting="agilerl serve --max-image-pixels")
        self.steps = 0
        self.episode_id: str | None = None

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def reply(self, raw: str | bytes) -> dict[str, Any] | None:
        try:
            frame = parse_client_frame(raw)
            kind = frame["type"]
            client = self.client
            if kind == "step":
                data = frame["data"]
                if "tool_name" in data:  # a parsed tool call (tool_parser): the env's call_tool
                    result = await self._call_tool(data["tool_name"], data.get("arguments"))
                elif "message" not in data:
                    raise FrameError(ErrorCode.VALIDATION_ERROR, "invalid message: data.message: Field required")
                else:
                    result = await client.astep(data["message"])
                text, reward, terminated, truncated, info = result
                if type(text) is not str:  # a plain text step (every step of most envs) skips the call
                    self._check_images(text, "step")
                self.steps += 1
                return observation_frame(text, reward, terminated, truncated, info if self.with_info else None)
            if kind == "reset":
                data = frame.get("data") or {}
                text, info = await client.areset(
                    data.get("seed"), row_index=data.get("row_index"), evaluation=data.get("evaluation")
                )
                self._check_images(text, "reset")
                self.steps = 0
                self.episode_id = uuid.uuid4().hex
                return observation_frame(text, 0.0, False, False, info if self.with_info else None)
            if kind == "state":
                state = await client.astate()
                return state_frame({"episode_id": self.episode_id, "step_count": self.steps, **state})
            if kind == "mcp":
                return mcp_frame(await self.mcp(frame["data"]))
            return None  # close
        except FrameError as exc:
            return error_frame(exc.code, str(exc), **exc.extra)
        except Exception as exc:
            return error_frame(ErrorCode.EXECUTION_ERROR, exception_text(exc))

    def _check_images(self, observation: Any, method: str) -> None:
        """Each image's size (from its header or shape) against the bound, before encoding it."""
        if isinstance(observation, ImageObservation):
            for image in observation.images:
                self.image_limits.check_image(image, f"{self.client.name}.{method}()")

    async def _call_tool(self, name: Any, arguments: Any) -> Any:
        """The env's ``call_tool``, only for a tool it lists and arguments its schema allows:
        checked (and coerced) by the in-process checker, ``ToolSet``; a call that cannot run is
        answered as in process, its error in the tool role, and the episode goes on."""
        if self._tools is None:
            self._tools = ToolSet(await self.client.alist_tools())
        call = self._tools.call(name, {} if arguments is None else arguments)
        return await self.client.acall_tool(call.name, call.arguments) if call.ok else call.refusal()

    async def mcp(self, payload: Any) -> dict[str, Any]:
        """A text env has no MCP tools: OpenEnv's answers for an env without MCP."""
        request = parse_rpc(payload)
        if isinstance(request, dict):
            return request
        if request.method in ("tools/list", "tools/call"):
            return rpc_error(RpcCode.INTERNAL_ERROR, "Environment does not support MCP", request.id)
        return rpc_error(RpcCode.METHOD_NOT_FOUND, f"Method not found: {request.method}", request.id)
