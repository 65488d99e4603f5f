"""Finding and loading plugins: each ``agilerl.plugins`` entry point, our own built-ins first.

Every failure is recorded on the plugin's :class:`PluginInfo` instead of raised, so one broken
distribution never hides the others; ``agilerl plugins list`` shows the causes.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import importlib_metadata
import pluggy
from packaging.utils import canonicalize_name

from agilerl.registry import hookspecs

__all__ = [
    "ENTRY_POINT_GROUP",
    "BUILTIN_PLUGIN_NAME",
    "BUILTIN_DISTRIBUTION",
    "SELECT_ENV_VAR",
    "STRICT_ENV_VAR",
    "TIMEOUT_ENV_VAR",
    "DEFAULT_PLUGIN_TIMEOUT_S",
    "PluginInfo",
    "new_plugin_manager",
    "selected_plugin_names",
    "strict_plugins",
    "plugin_timeout",
    "Outcome",
    "call_plugin_code",
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
    """Run plugin code (an import, a hook) so that it cannot hold or end the command.

    It runs on a daemon thread, waited for at most :func:`plugin_timeout` seconds (a thread
    still running then is left behind, and dies with the process); what it prints goes to
    stderr, so ``--json`` output stays clean; anything it raises, ``SystemExit`` included, comes
    back as ``error``. Only ``KeyboardInterrupt`` (the user's Ctrl-C) propagates.
    """
    timeout = plugin_timeout() if deadline else None
    outcome = Outcome()

    def target() -> None:
        try:
            outcome.value = function()
        except BaseException as exc:  # noqa: BLE001 - a plugin may raise anything, even SystemExit
            outcome.value = exc
            outcome.error = one_line(exc)

    worker = threading.Thread(target=target, name="agilerl-plugin", daemon=True)
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        worker.start()
        worker.join(timeout)
    finally:
        sys.stdout = stdout
    if worker.is_alive():
        _StdoutToStderrFor.install(worker)  # what it prints later cannot land in --json either
        return Outcome(error=f"did not finish within {timeout:g} s ({TIMEOUT_ENV_VAR}); skipped", timed_out=True)
    if isinstance(outcome.value, KeyboardInterrupt):
        raise outcome.value
    return outcome


class _StdoutToStderrFor:
    """``sys.stdout`` once a plugin's thread is left running: its writes go to stderr, all
    others' to the real stdout."""

    def __init__(self, stdout: Any) -> None:
        self._stdout = stdout
        self._threads: set[threading.Thread] = set()

    @classmethod
    def install(cls, thread: threading.Thread) -> None:
        router = sys.stdout if isinstance(sys.stdout, cls) else cls(sys.stdout)
        router._threads.add(thread)
        sys.stdout = router

    def _target(self) -> Any:
        return sys.stderr if threading.current_thread() in self._threads else self._stdout

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stdout, name)


def warn_skipped(info: PluginInfo) -> None:
    """A skipped slow plugin is named at once: the wait the user just had needs a cause."""
    print(f"warning: {info.source}: {info.error}", file=sys.stderr, flush=True)


def _load_entry_points(pm: pluggy.PluginManager, selected: set[str] | None) -> list[PluginInfo]:
    infos: list[PluginInfo] = []
    owners: dict[str, PluginInfo] = {}
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
        _register(pm, ep, info)
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


def _register(pm: pluggy.PluginManager, ep: Any, info: PluginInfo) -> None:
    loaded = call_plugin_code(ep.load, deadline=not info.builtin)  # the built-ins are ours: no deadline
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
