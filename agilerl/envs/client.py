"""The env-client seam: one small interface (``EnvClient``), two implementations, and the base of
clients that wrap another (``WrappingClient``).

``InProcessEnvClient`` calls a text env living in this process; ``RemoteEnvClient``
(``agilerl.remote.client``) talks to one over a WebSocket. Both offer the same methods, sync
(``reset``/``step``/``state``/``close``) and async (``areset``/``astep``/``astate``/``aclose``),
and both hand back results checked against the protocol's rules (``agilerl.protocol``).
"""

from __future__ import annotations

import inspect
from typing import Any

from agilerl.concurrency import EnvCaller, default_threads
from agilerl.errors import EnvError, EnvProtocolError, exception_text
from agilerl.protocol import (
    EnvInfo,
    StepResult,
    check_reset_result,
    check_step_result,
    describe_env,
    read_state,
    reset_kwargs,
    state_dict,
)

__all__ = ["EnvClient", "InProcessEnvClient", "WrappingClient", "as_client", "default_threads_caller"]


class EnvClient:
    """Base of the env clients: the text-env interface plus ``state``, sync and async.

    Subclasses implement the sync methods and, when they can wait without a thread (network I/O),
    the async ones; the default async methods run the sync ones on a worker thread. ``blocking``
    says whether the sync methods hold a thread for the env's own work (then the collector's
    thread-per-env fast path suits the client) or mostly wait on I/O.
    The harness wraps anything that is not an ``EnvClient`` in an ``InProcessEnvClient``.
    """

    blocking: bool = True
    reconnects: bool = False
    """Whether the client outlives a failed episode: its next reset opens a fresh session (a remote
    client does), so a collector keeps it rather than building another."""
    retry_budget_s: float = 0.0
    """How long a reset may spend reconnecting through an outage before it fails."""

    def describe(self) -> EnvInfo:
        """What the env declares about itself (turn budget, tools, ...), read once."""
        raise NotImplementedError

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first prompt and an info dict."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Send the model's text; return observation, reward, terminated, truncated, info."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """The env's state as a dict ({} when it has none)."""
        raise NotImplementedError

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """Run one parsed tool call (MCP ``call_tool``, or a text env's ``call_tool`` method); the
        observation is the tool's result. See docs/tools.md."""
        raise EnvProtocolError(f"{type(self).__name__} cannot run tool calls")

    def list_tools(self) -> list[dict[str, Any]] | None:
        """The env's tools (MCP ``tools/list``, else what it declares); None when it has none."""
        return self.describe().tools

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """``call_tool`` for async code."""
        return await default_threads_caller().in_thread(self.call_tool, name, arguments)

    async def alist_tools(self) -> list[dict[str, Any]] | None:
        """``list_tools`` for async code."""
        return await default_threads_caller().in_thread(self.list_tools)

    def close(self) -> None:
        """Release the env; safe to call more than once."""
        raise NotImplementedError

    async def areset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``reset`` for async code."""
        return await default_threads_caller().in_thread(self.reset, seed, row_index=row_index, evaluation=evaluation)

    async def astep(self, action: str) -> StepResult:
        """``step`` for async code."""
        return await default_threads_caller().in_thread(self.step, action)

    async def astate(self) -> dict[str, Any]:
        """``state`` for async code."""
        return await default_threads_caller().in_thread(self.state)

    async def aclose(self) -> None:
        """``close`` for async code."""
        await default_threads_caller().in_thread(self.close)


class WrappingClient(EnvClient):
    """An env client around another: every method is the wrapped client's, and a subclass
    overrides what it changes (eval's recording, tool routing). Attributes it lacks (``url``,
    ``name``, ``env``, ...) are the wrapped client's too."""

    def __init__(self, inner: EnvClient) -> None:
        self.inner = inner
        self.blocking, self.reconnects, self.retry_budget_s = inner.blocking, inner.reconnects, inner.retry_budget_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def describe(self) -> EnvInfo:
        return self.inner.describe()

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        return self.inner.reset(seed, row_index=row_index, evaluation=evaluation)

    async def areset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        return await self.inner.areset(seed, row_index=row_index, evaluation=evaluation)

    def step(self, action: str) -> StepResult:
        return self.inner.step(action)

    async def astep(self, action: str) -> StepResult:
        return await self.inner.astep(action)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        return self.inner.call_tool(name, arguments)

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        return await self.inner.acall_tool(name, arguments)

    def list_tools(self) -> list[dict[str, Any]] | None:
        return self.inner.list_tools()

    async def alist_tools(self) -> list[dict[str, Any]] | None:
        return await self.inner.alist_tools()

    def state(self) -> dict[str, Any]:
        return self.inner.state()

    async def astate(self) -> dict[str, Any]:
        return await self.inner.astate()

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner.aclose()


class InProcessEnvClient(EnvClient):
    """Wraps a text env living in this process; the same interface as ``RemoteEnvClient``.

    The async methods run the env through ``caller`` (an ``EnvCaller``: sync methods on worker
    threads, so a hung env never blocks the caller's event loop; ``async def`` ones awaited); the
    env server passes its own, whose threads all its sessions share. Without one, the
    process-wide worker threads are used.
    """

    def __init__(self, env: Any, *, caller: EnvCaller | None = None) -> None:
        self.env = env
        self._caller = caller
        self._closed = False
        self.name = type(env).__name__
        self.blocking = not inspect.iscoroutinefunction(getattr(env, "step", None))
        self._info: EnvInfo | None = None

    def describe(self) -> EnvInfo:
        """The env's declared members by the protocol's rules (``describe_env``), as a server
        serving it would publish them."""
        if self._info is None:
            self._info = describe_env(self.env)
        return self._info

    # -- sync ----------------------------------------------------------------------------------

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        result = self.env.reset(seed=seed, **reset_kwargs(row_index, evaluation))
        return check_reset_result(result, self.name)

    def step(self, action: str) -> StepResult:
        return check_step_result(self.env.step(action), self.name)

    def state(self) -> dict[str, Any]:
        return state_dict(read_state(self.env))

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        method = self._tool_method()
        try:
            result = method(name, arguments)
        except TimeoutError:
            raise
        except Exception as exc:
            raise self._tool_failure(name, exc) from exc
        return check_step_result(result, self.name, "call_tool")

    def list_tools(self) -> list[dict[str, Any]] | None:
        listed = getattr(self.env, "list_tools", None)  # an OpenEnv MCP env lists its own
        tools = listed() if callable(listed) else None
        return tools if tools is not None else self.describe().tools

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        method = self._tool_method()
        try:
            result = await self._calls().call(method, name, arguments)
        except TimeoutError:
            raise
        except Exception as exc:
            raise self._tool_failure(name, exc) from exc
        return check_step_result(result, self.name, "call_tool")

    def _tool_failure(self, tool: str, exc: Exception) -> EnvError:
        """What the env's ``call_tool`` raised, naming the method and the tool (not ``step``)."""
        return EnvError(f"{self.name}.call_tool({tool!r}) raised {exception_text(exc)}")

    def _tool_method(self) -> Any:
        method = getattr(self.env, "call_tool", None)
        if not callable(method):
            raise EnvProtocolError(
                f"{self.name} has no call_tool(name, arguments) method, so it cannot receive the "
                "model's parsed tool calls: add one beside its tools (docs/tools.md), or leave "
                "environment.tool_parser unset so it receives the model's text in step()."
            )
        return method

    def close(self) -> None:
        """Close the env exactly once, however often this is called."""
        self._close_once()

    # -- async ---------------------------------------------------------------------------------

    async def areset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        result = await self._calls().call(self.env.reset, seed=seed, **reset_kwargs(row_index, evaluation))
        return check_reset_result(result, self.name)

    async def astep(self, action: str) -> StepResult:
        return check_step_result(await self._calls().call(self.env.step, action), self.name)

    async def astate(self) -> dict[str, Any]:
        state = getattr(self.env, "state", None)
        return state_dict(await self._calls().call(state) if callable(state) else state)

    async def aclose(self) -> None:
        """Close the env exactly once, on a worker thread (closing may block); an ``async def``
        close is awaited."""
        await self._calls().in_thread(self._close_once)

    def _close_once(self) -> Any:
        if self._closed:
            return None
        self._closed = True
        close = getattr(self.env, "close", None)
        return close() if callable(close) else None

    def _calls(self) -> EnvCaller:
        return self._caller or default_threads_caller()


def as_client(env: Any) -> EnvClient:
    """``env`` when it is a client already, else an ``InProcessEnvClient`` around it."""
    return env if isinstance(env, EnvClient) else InProcessEnvClient(env)


_default_caller: EnvCaller | None = None


def default_threads_caller() -> EnvCaller:
    """An ``EnvCaller`` on the process-wide worker threads."""
    global _default_caller
    if _default_caller is None:
        _default_caller = EnvCaller(default_threads())
    return _default_caller
