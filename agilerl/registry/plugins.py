"""Finding and loading plugins: each ``agilerl.plugins`` entry point, our own built-ins first.

Every failure is recorded on the plugin's :class:`PluginInfo` instead of raised, so one broken
distribution never hides the others; ``agilerl plugins list`` shows the causes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import importlib_metadata
import pluggy
from packaging.utils import canonicalize_name

from agilerl.registry import hookspecs

ENTRY_POINT_GROUP = "agilerl.plugins"
BUILTIN_PLUGIN_NAME = "agilerl"
BUILTIN_DISTRIBUTION = "agilerl-envlayer"
"""Our own distribution: its ``agilerl`` entry point is the built-ins, always loaded."""
SELECT_ENV_VAR = "AGILERL_PLUGINS"
STRICT_ENV_VAR = "AGILERL_STRICT_PLUGINS"


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
    try:
        module = ep.load()
    except BaseException as exc:  # a plugin's import may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        info.error = f"import failed: {one_line(exc)}"
        return
    try:
        pm.register(module, name=ep.name)
    except (ValueError, pluggy.PluginValidationError) as exc:  # e.g. a hook's wrong arguments
        info.error = f"could not register: {one_line(exc)}"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: the cause as one table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
