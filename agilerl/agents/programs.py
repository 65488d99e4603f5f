"""Running an agent for one episode: a program (``agent_command``) or a Python function (``agent``).

A program gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (its episode's key), ``AGILERL_TASK`` (the
task as JSON; a task past ``TASK_ENV_BYTES`` only in the file ``AGILERL_TASK_FILE`` names, which
every program gets: Linux refuses to start a program with an environment variable past 128 KiB)
and ``AGILERL_EPISODE``; its reward is its last stdout line, ``{"reward": r}``
(optionally with ``"components"``). It runs in a process group of its own, killed whole at the
episode's end, so nothing it started outlives the episode. Its output goes to files, not pipes:
a grandchild holding a pipe open cannot stall the episode, and only the tail is read.

A function is ``fn(task, base_url, api_key) -> reward`` (a number, ``{"reward": r, "components":
{...}}`` or None), sync or async.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AgentOutcome", "AgentRunner", "CommandAgent", "FunctionAgent", "reward_of"]

_TAIL_BYTES = 4096
TASK_ENV_BYTES = 64 * 1024
"""The largest task (its JSON) given in ``AGILERL_TASK`` too; each variable holds at most 128 KiB."""


@dataclass
class AgentOutcome:
    """How one agent run ended: its reward (None: it gave none), or why it failed."""

    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    """``exit code N``, ``timeout``, ``no reward line`` (when a reward is required), ``raised ...``."""
    stderr_tail: str = ""


class AgentRunner:
    """Runs the agent of one episode to its end (or ``timeout_s``, or ``cancel`` being set)."""

    what: str = "agent"

    def run(self, task: Any, base_url: str, api_key: str, episode_id: str, timeout_s: float,
            cancel: threading.Event) -> AgentOutcome:
        raise NotImplementedError


def reward_of(value: Any, where: str) -> tuple[float, dict[str, float]] | None:
    """A reward as an agent reports it: a number or ``{"reward": r, "components": {...}}``; None
    for None or ``{"reward": null}``. ``ValueError`` naming ``where`` for anything else."""
    if value is None:
        return None
    if isinstance(value, dict):
        components = value.get("components") or {}
        if not isinstance(components, dict) or not all(_finite(v) for v in components.values()):
            raise ValueError(f"{where}: 'components' must map names to finite numbers, got {components!r:.200}")
        value, parts = value.get("reward"), {str(k): float(v) for k, v in components.items()}
        if value is None:  # {"reward": null}: no reward, as printing none (the rubrics score it)
            return None
    else:
        parts = {}
    if not _finite(value):
        raise ValueError(f"{where}: the reward must be a finite number, got {value!r:.200}")
    return float(value), parts


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


class CommandAgent(AgentRunner):
    """``argv`` run once per episode (see the module doc); ``cwd`` is the manifest's folder. A
    leading ``python`` (or ``python3``) is the trainer's own interpreter, so the program sees the
    packages the run was started with, whatever ``PATH`` says."""

    def __init__(self, argv: Sequence[str], *, cwd: str | Path | None = None, needs_reward: bool = True) -> None:
        if not argv:
            raise ValueError("agent_command needs a program: [program, args...]")
        self.argv = [sys.executable if argv[0] in ("python", "python3") else argv[0], *argv[1:]]
        self.cwd = cwd
        self.needs_reward = needs_reward
        self.what = " ".join(argv)

    def run(self, task: Any, base_url: str, api_key: str, episode_id: str, timeout_s: float,
            cancel: threading.Event) -> AgentOutcome:
        task_json = json.dumps(task, default=str)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile(
            "w", prefix="agilerl-task-", suffix=".json", encoding="utf-8"
        ) as task_file:
            task_file.write(task_json)
            task_file.flush()
            env = {
                **os.environ,
                "OPENAI_BASE_URL": base_url,
                "OPENAI_API_KEY": api_key,
                "AGILERL_TASK_FILE": task_file.name,
                "AGILERL_EPISODE": episode_id,
            }
            size = len(task_json.encode())
            in_env = size <= TASK_ENV_BYTES
            if in_env:
                env["AGILERL_TASK"] = task_json
            else:
                env.pop("AGILERL_TASK", None)  # not the trainer's own, if it has one
            try:
                proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=self.cwd,
                    start_new_session=True,  # its own process group: killed whole at the episode's end
                )
            except OSError as exc:
                return AgentOutcome(failure=f"could not start: {exc}", stderr_tail=str(exc))
            failure = None
            try:
                deadline = time.monotonic() + timeout_s
                while proc.poll() is None:
                    if cancel.is_set():
                        failure = "stopped"
                        break
                    if time.monotonic() >= deadline:
                        failure = f"timeout (outlived episode_timeout_s {timeout_s:g})"
                        break
                    try:
                        proc.wait(timeout=0.05)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                _kill_group(proc)
            tail = _tail(err)
            if failure is None and proc.returncode != 0:
                failure = f"exit code {proc.returncode}"
                if not in_env:
                    failure += (f" (its task's JSON, {size:,} bytes, is past the {TASK_ENV_BYTES:,} "
                                "that AGILERL_TASK holds: read the file AGILERL_TASK_FILE names)")
            if failure is not None:
                return AgentOutcome(failure=failure, stderr_tail=tail)
            line = _last_line(out)
        try:
            reward = reward_of(json.loads(line), "its last stdout line") if line.startswith("{") else None
        except ValueError as exc:
            return AgentOutcome(failure=f"bad reward line: {exc}", stderr_tail=tail)
        if reward is None:
            failure = "no reward line (the last stdout line must be {\"reward\": r})" if self.needs_reward else None
            return AgentOutcome(failure=failure, stderr_tail=tail)
        return AgentOutcome(reward[0], reward[1], stderr_tail=tail)


class FunctionAgent(AgentRunner):
    """``fn(task, base_url, api_key)`` in this process: a sync one on the calling thread, an async
    one on a loop of its own (cancelled at the timeout). A sync one that hangs cannot be killed:
    its episode ends at the timeout and its key is revoked."""

    def __init__(self, fn: Callable[..., Any], *, name: str = "", needs_reward: bool = True) -> None:
        self.fn = fn
        self.needs_reward = needs_reward
        self.what = name or getattr(fn, "__qualname__", repr(fn))

    def run(self, task: Any, base_url: str, api_key: str, episode_id: str, timeout_s: float,
            cancel: threading.Event) -> AgentOutcome:
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                result = self.fn(task, base_url, api_key)
                if inspect.isawaitable(result):
                    result = asyncio.run(asyncio.wait_for(_awaited(result), timeout_s))
                box["value"] = result
            except BaseException as exc:  # noqa: BLE001 - the agent's error is its episode's failure
                box["error"] = exc

        thread = threading.Thread(target=call, name=f"agilerl-agent-{episode_id}", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and not cancel.is_set() and time.monotonic() < deadline:
            thread.join(0.05)
        if thread.is_alive():
            return AgentOutcome(failure="stopped" if cancel.is_set() else f"timeout (outlived episode_timeout_s {timeout_s:g})")
        if "error" in box:
            exc = box["error"]
            kind = "timeout" if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else "raised"
            return AgentOutcome(failure=f"{kind} {type(exc).__name__}: {exc}", stderr_tail=f"{type(exc).__name__}: {exc}")
        try:
            reward = reward_of(box.get("value"), f"{self.what}'s return value")
        except ValueError as exc:
            return AgentOutcome(failure=str(exc))
        if reward is None:
            return AgentOutcome(failure="returned no reward" if self.needs_reward else None)
        return AgentOutcome(reward[0], reward[1])


async def _awaited(result: Any) -> Any:
    return await result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the program and everything it started (its process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        pass


def _tail(file: Any) -> str:
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - _TAIL_BYTES))
    return file.read().decode(errors="replace").strip()


def _last_line(file: Any) -> str:
    lines = _tail(file).splitlines()
    return lines[-1].strip() if lines else ""
