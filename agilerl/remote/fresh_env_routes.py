"""OpenEnv's stateless HTTP routes beside ``/ws``: ``POST /reset``, ``POST /step``, ``GET /state``
and ``POST /mcp``, each one call on a fresh env that is closed right after, answered as
OpenEnv's server answers them (422 with ``detail`` for bad input, 500 otherwise)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pydantic_core
from aiohttp import web

from agilerl.remote.dispatch import Session
from agilerl.remote.frames import ErrorCode, RpcCode, decode, encode, error_frame, rpc_error, unsendable

__all__ = ["FreshEnvRoutes"]

T = TypeVar("T")
WithFreshEnv = Callable[[Callable[[Session], Awaitable[Any]]], Awaitable[Any]]
_HTTP_STATUS = {ErrorCode.VALIDATION_ERROR.value: 422, ErrorCode.INVALID_JSON.value: 400}
_INVALID = object()


class FreshEnvRoutes:
    """The four routes, over the server's ``with_fresh_env`` (a session on a fresh env, on its own
    thread, closed after ``use``)."""

    def __init__(self, with_fresh_env: WithFreshEnv) -> None:
        self._with_fresh_env = with_fresh_env

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/reset", self.reset)
        router.add_post("/step", self.step)
        router.add_get("/state", self.state)
        router.add_post("/mcp", self.mcp)

    async def reset(self, request: web.Request) -> web.Response:
        """``POST /reset``: a fresh env's first observation."""
        body = await _json_body(request, default={})
        if not isinstance(body, dict):
            return _http_error(error_frame(ErrorCode.VALIDATION_ERROR, "the body is a JSON object of reset keywords"))
        return await self._one_call({"type": "reset", "data": body})

    async def step(self, request: web.Request) -> web.Response:
        """``POST /step`` with ``{"action": {...}}``: one step of a fresh env."""
        body = await _json_body(request, default=None)
        if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
            errors = [{"type": "missing", "loc": ["body", "action"], "msg": "Field required"}]
            return _http_error(error_frame(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors))
        return await self._one_call({"type": "step", "data": body["action"]})

    async def state(self, request: web.Request) -> web.Response:
        """``GET /state``: a fresh env's state."""
        return await self._one_call({"type": "state"})

    async def mcp(self, request: web.Request) -> web.Response:
        """``POST /mcp``: one JSON-RPC request (``tools/list``, ``tools/call``) on a fresh env."""
        try:
            payload = decode(await request.read())
        except ValueError:
            return web.json_response(rpc_error(RpcCode.PARSE_ERROR, "Parse error"))
        try:
            answer = await self._with_fresh_env(lambda session: session.mcp(payload))
        except Exception as exc:
            answer = rpc_error(RpcCode.SERVER_ERROR, f"the env factory failed: {type(exc).__name__}: {exc}")
        return web.Response(body=encode(answer), content_type="application/json")

    async def _one_call(self, frame: dict[str, Any]) -> web.Response:
        raw = encode(frame)
        try:
            reply = await self._with_fresh_env(lambda session: session.reply(raw))
        except Exception as exc:
            reply = error_frame(ErrorCode.FACTORY_ERROR, f"the env factory failed: {type(exc).__name__}: {exc}")
        if reply is None or reply["type"] == "error":
            return _http_error(reply)
        try:
            body = encode(reply["data"])
        except pydantic_core.PydanticSerializationError as exc:
            return _http_error(unsendable(exc))
        return web.Response(body=body, content_type="application/json")


async def _json_body(request: web.Request, default: Any) -> Any:
    raw = await request.read()
    if not raw.strip():
        return default
    try:
        return decode(raw)
    except ValueError:
        return _INVALID


def _http_error(frame: dict[str, Any] | None) -> web.Response:
    """An error frame as OpenEnv's HTTP routes answer: 422 with ``detail`` for bad input, 500."""
    data = (frame or {}).get("data") or {"message": "the request closed the session", "code": None}
    status = _HTTP_STATUS.get(data.get("code"), 500)
    detail = data.get("errors") or data.get("message")
    return web.Response(body=encode({"detail": detail, "code": data.get("code")}), status=status,
                        content_type="application/json")
