"""Finding and loading plugins: each ``agilerl.plugins`` entry point, our own built-ins first.

Every failure is recorded on the plugin's :class:`PluginInfo` instead of raised, so one broken
distribution never hides the others; ``agilerl plugins list`` shows the causes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import importlib_metadata
import pluggy
from packaging.utils import canonicalize_name

from agilerl.registry import hookspecs
from agilerl.stdout_guard import StdoutToStderr

__all__ = [
    "ENTRY_POINT_GROUP",
    "BUILTIN_PLUGIN_NAME",
    "BUILTIN_DISTRIBUTION",
    "SELECT_ENV_VAR",
    "STRICT_ENV_VAR",
    "TIMEOUT_ENV_VAR",
    "DEFAULT_PLUGIN_TIMEOUT_S",
    "MAX_NAME_LENGTH",
    "name_problem",
    "shown_name",
    "PluginInfo",
    "new_plugin_manager",
    "selected_plugin_names",
    "strict_plugins",
    "plugin_timeout",
    "Outcome",
    "call_plugin_code",
    "call_plugin_codes",
    "warn_skipped",
    "one_line",
]

ENTRY_POINT_GROUP = "agilerl.plugins"
BUILTIN_PLUGIN_NAME = "agilerl"
BUILTIN_DISTRIBUTION = "agilerl-envlayer"
"""Our own distribution: its ``agilerl`` entry point is the built-ins, always loaded."""
SELECT_ENV_VAR = "AGILERL_PLUGINS"
STRICT_ENV_VAR = "AGILERL_STRICT_PLUGINS"
TIMEOUT_ENV_VAR = "AGILERL_PLUGIN_TIMEOUT"
DEFAULT_PLUGIN_TIMEOUT_S = 5.0
"""How long one plugin's import (or one of its hooks) may take before it is skipped."""


MAX_NAME_LENGTH = 128
"""The longest name a plugin may register (or an entry point have): names are typed and shown."""


def name_problem(name: Any) -> str | None:
    """What is wrong with a plugin's name (entry point), or None: text of at most
    :data:`MAX_NAME_LENGTH` printable characters, with no ``:``."""
    if not isinstance(name, str):
        return f"{shown_name(name)} is not a string"
    if not name or len(name) > MAX_NAME_LENGTH:
        return f"{shown_name(name)} is {len(name):,} characters long; names are 1 to {MAX_NAME_LENGTH}"
    if not name.isprintable() or ":" in name:
        return f"{shown_name(name)} holds {'a :' if ':' in name else 'an unprintable character'}"
    return None


def shown_name(name: Any) -> str:
    """A name as an error shows it: its ``repr`` (control characters escaped), cut to 60 characters."""
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:50]}...{text[-6:]}"


@dataclass
class PluginInfo:
    """What is known about one plugin: where it comes from, what it provides, what went wrong."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    builtin: bool = False
    hooks: list[str] = field(default_factory=list)
    provides: dict[str, list[str]] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def status(self) -> str:
        """``ok``, ``error`` (``error`` holds the cause) or ``conflict`` (``conflicts`` lists them)."""
        if self.error:
            return "error"
        return "conflict" if self.conflicts else "ok"

    @property
    def source(self) -> str:
        """The distribution that owns the plugin, for error messages."""
        if self.distribution is None:
            return f"plugin {self.name!r} (registered in-process)"
        version = f" {self.version}" if self.version else ""
        return f"plugin {self.name!r} (distribution {self.distribution}{version})"


def new_plugin_manager() -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """A manager holding the built-ins and the selected entry points, plus every plugin's record."""
    pm = pluggy.PluginManager("agilerl")
    pm.add_hookspecs(hookspecs)
    return pm, _load_entry_points(pm, selected_plugin_names())


def selected_plugin_names() -> set[str] | None:
    """``AGILERL_PLUGINS=a,b``: only those entry points; empty: none; unset: all."""
    raw = os.environ.get(SELECT_ENV_VAR)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def strict_plugins() -> bool:
    """``AGILERL_STRICT_PLUGINS=1`` turns a broken or conflicting plugin into an error."""
    return os.environ.get(STRICT_ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")


def plugin_timeout() -> float | None:
    """``AGILERL_PLUGIN_TIMEOUT`` seconds (default 5); ``0`` waits for ever."""
    from agilerl.errors import PluginError

    raw = os.environ.get(TIMEOUT_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_PLUGIN_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise PluginError(
            f"{TIMEOUT_ENV_VAR}={raw!r} is not a number of seconds: set e.g. {TIMEOUT_ENV_VAR}=30 "
            "(0 waits for ever)."
        )
    return seconds or None


@dataclass
class Outcome:
    """What running a piece of plugin code gave: its value, or why it gave none."""

    value: Any = None
    error: str | None = None
    """``Type: message`` of what it raised, or that it ran out of time."""
    timed_out: bool = False


def call_plugin_code(function: Callable[[], Any], *, deadline: bool = True) -> Outcome:
    """Run one piece of plugin code (an import, a hook) so that it cannot hold or end the command
    (:func:`call_plugin_codes` with one)."""
    return call_plugin_codes([function], deadlines=[deadline])[0]


def call_plugin_codes(functions: Sequence[Callable[[], Any]], *, deadlines: Sequence[bool]) -> list[Outcome]:
    """Run several plugins' code at once, each so that it cannot hold or end the command; the
    outcomes in the order given.

    Each runs on its own daemon thread, all started together, each waited for at most
    :func:`plugin_timeout` seconds from the start (``deadlines[i]`` False: no limit), so N slow
    plugins cost one timeout, not N; a thread still running then is left behind, and dies with
    the process. What they write to stdout, ``print`` or ``os.write(1, ...)``, goes to stderr
    (``agilerl.stdout_guard.StdoutToStderr``), so ``--json`` output stays clean; anything they raise,
    ``SystemExit`` included, comes back as ``error``. Only ``KeyboardInterrupt`` propagates.
    """
    timeout = plugin_timeout() if any(deadlines) else None
    outcomes = [Outcome() for _ in functions]

    def target(function: Callable[[], Any], outcome: Outcome) -> None:
        try:
            outcome.value = function()
        except BaseException as exc:  # noqa: BLE001 - a plugin may raise anything, even SystemExit
            outcome.value = exc
            outcome.error = one_line(exc)

    workers = [
        threading.Thread(target=target, args=(function, outcome), name="agilerl-plugin", daemon=True)
        for function, outcome in zip(functions, outcomes)
    ]
    with StdoutToStderr() as output:
        for worker in workers:
            worker.start()
        start = time.monotonic()
        for worker, deadline in zip(workers, deadlines):
            worker.join(max(0.0, start + timeout - time.monotonic()) if deadline and timeout is not None else None)
        output.left_running([worker for worker in workers if worker.is_alive()])
    results = []
    for worker, outcome in zip(workers, outcomes):
        if worker.is_alive():
            results.append(
                Outcome(error=f"did not finish within {timeout:g} s ({TIMEOUT_ENV_VAR}); skipped", timed_out=True)
            )
        elif isinstance(outcome.value, KeyboardInterrupt):
            raise outcome.value
        else:
            results.append(outcome)
    return results


def warn_skipped(info: PluginInfo) -> None:
    """A skipped slow plugin is named at once: the wait the user just had needs a cause."""
    print(f"warning: {info.source}: {info.error}", file=sys.stderr, flush=True)


def _load_entry_points(pm: pluggy.PluginManager, selected: set[str] | None) -> list[PluginInfo]:
    infos: list[PluginInfo] = []
    owners: dict[str, PluginInfo] = {}
    to_load: list[tuple[Any, PluginInfo]] = []
    entry_points = list(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP))
    builtins = [ep for ep in entry_points if _is_builtin(ep)]
    if not builtins:
        infos.append(
            PluginInfo(
                name=BUILTIN_PLUGIN_NAME,
                builtin=True,
                error=(
                    f"the built-ins are not registered: distribution {BUILTIN_DISTRIBUTION} is not "
                    "installed (run agilerl from an installed copy: pip install -e .)"
                ),
            )
        )
    for ep in builtins + [ep for ep in entry_points if not _is_builtin(ep)]:
        builtin = _is_builtin(ep)
        if selected is not None and ep.name not in selected and not builtin:
            continue
        dist = ep.dist
        info = PluginInfo(
            name=ep.name,
            distribution=dist.name if dist is not None else None,
            version=dist.version if dist is not None else None,
            module=ep.value,
            builtin=builtin,
        )
        infos.append(info)
        first = owners.setdefault(ep.name, info)
        if first is not info:
            # pluggy would skip this one without a word; say which two distributions clash.
            info.error = (
                f"entry-point name {ep.name!r} is also used by distribution {first.distribution}; "
                f"only the first is loaded. Rename the entry point in {info.distribution} "
                "(or uninstall one of them)."
            )
            continue
        if ep.name == BUILTIN_PLUGIN_NAME and not builtin:
            info.error = f"entry-point name {ep.name!r} is reserved for agilerl's built-ins; rename it."
            continue
        if (problem := name_problem(ep.name)) is not None:
            info.name = shown_name(ep.name)
            info.error = f"entry-point name {problem}; rename it."
            continue
        to_load.append((ep, info))
    # every plugin's import at once, each bounded: N slow plugins cost one timeout, not N
    loaded = call_plugin_codes([ep.load for ep, _ in to_load], deadlines=[not info.builtin for _, info in to_load])
    for (ep, info), outcome in zip(to_load, loaded):
        _register(pm, ep, info, outcome)
    installed = ", ".join(sorted({ep.name for ep in entry_points if not _is_builtin(ep)}))
    for missing in sorted((selected or set()) - set(owners)):
        infos.append(
            PluginInfo(
                name=missing,
                error=(
                    f"{SELECT_ENV_VAR} names {missing!r}, but no installed distribution has an "
                    f"{ENTRY_POINT_GROUP!r} entry point of that name "
                    f"(installed: {installed or 'none'})."
                ),
            )
        )
    return infos


def _is_builtin(ep: Any) -> bool:
    dist = ep.dist
    return (
        ep.name == BUILTIN_PLUGIN_NAME
        and dist is not None
        and canonicalize_name(dist.name) == BUILTIN_DISTRIBUTION
    )


def _register(pm: pluggy.PluginManager, ep: Any, info: PluginInfo, loaded: Outcome) -> None:
    """Register what the entry point's import gave (the built-ins are ours: imported with no deadline)."""
    if loaded.timed_out:
        info.error = f"import {loaded.error}"
        warn_skipped(info)
        return
    if loaded.error is not None:
        info.error = f"import failed: {loaded.error}"
        return
    module = loaded.value
    try:
        pm.register(module, name=ep.name)
    except (ValueError, pluggy.PluginValidationError) as exc:  # e.g. a hook's wrong arguments
        info.error = f"could not register: {one_line(exc)}"


def one_line(exc: BaseException) -> str:
    """``Type: message`` as one table cell (a pydantic error as its field, value and message)."""
    from agilerl.errors import error_line

    return error_line(exc)
