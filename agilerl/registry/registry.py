"""The registry: for each kind (env, processor, rubric, algorithm, model, tracker, generation backend,
tool parser) a name -> target map that
remembers which plugin and distribution registered each name.

Plugins' hooks run each plugin on its own thread, all at once (a slow one costs one timeout), and
a hook that raises or hangs drops only that plugin.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pluggy

from agilerl.errors import NameConflict, NameNotRegistered, RegistrationError, StrictPluginsError
from agilerl.registry.loading import is_reference, load_object
from agilerl.registry.plugins import (
    MAX_NAME_LENGTH,
    STRICT_ENV_VAR,
    Outcome,
    PluginInfo,
    call_plugin_codes,
    shown_name,
    strict_plugins,
    warn_skipped,
)

__all__ = [
    "Kind",
    "HOOK_OF_KIND",
    "KIND_OF_HOOK",
    "NAME_PATTERN",
    "Entry",
    "Registry",
    "build_registry",
    "check_strict",
]

Kind = Literal["env", "processor", "rubric", "algorithm", "model", "tracker", "backend", "tool_parser"]

HOOK_OF_KIND: dict[Kind, str] = {
    "env": "register_envs",
    "processor": "register_observation_processors",
    "rubric": "register_rubrics",
    "algorithm": "register_algorithms",
    "model": "register_models",
    "tracker": "register_trackers",
    "backend": "register_generation_backends",
    "tool_parser": "register_tool_parsers",
}
KIND_OF_HOOK = {hook: kind for kind, hook in HOOK_OF_KIND.items()}
NAME_PATTERN = re.compile(rf"[a-z0-9][a-z0-9._/-]{{0,{MAX_NAME_LENGTH - 1}}}\Z")
"""The name rule: what every registered name (a plugin's, an OpenEnv package's key) matches."""


@dataclass
class Entry:
    """One registered name; a ``"module:attr"`` target is imported on first :meth:`load`."""

    kind: Kind
    name: str
    target: Any
    description: str
    plugin: PluginInfo
    _loaded: Any = field(default=None, repr=False)

    @property
    def target_ref(self) -> str:
        """The target as text: the ``module:attr`` string, or where the object was defined."""
        if isinstance(self.target, str):
            return self.target
        reference = getattr(self.target, "registry_reference", None)  # an OpenEnv package says where it is
        return reference if isinstance(reference, str) else _describe(self.target)

    def load(self) -> Any:
        """The target object, importing a ``module:attr`` string the first time."""
        if not isinstance(self.target, str):
            return self.target
        if self._loaded is None:
            self._loaded = load_object(self.target)
        return self._loaded


class Registry:
    """Every registered name of every kind, and every plugin's record (errors included)."""

    def __init__(self, plugins: list[PluginInfo]) -> None:
        self.plugins = plugins
        self._entries: dict[Kind, dict[str, list[Entry]]] = {kind: {} for kind in HOOK_OF_KIND}

    def add(self, entry: Entry) -> None:
        self._entries[entry.kind].setdefault(entry.name, []).append(entry)

    def entries(self, kind: Kind) -> list[Entry]:
        """All entries of one kind sorted by name; a conflicting name appears once per plugin."""
        return [e for name in sorted(self._entries[kind]) for e in self._entries[kind][name]]

    def names(self, kind: Kind) -> list[str]:
        return sorted(self._entries[kind])

    def conflicts(self) -> dict[tuple[Kind, str], list[Entry]]:
        """Names registered by more than one plugin."""
        return {
            (kind, name): entries
            for kind, by_name in self._entries.items()
            for name, entries in by_name.items()
            if len(entries) > 1
        }

    def get(self, kind: Kind, name: str) -> Entry:
        """The entry registered as ``name``, or an error that says what is installed instead."""
        entries = self._entries[kind].get(name)
        if not entries:
            raise NameNotRegistered(self._not_registered_message(kind, name))
        if len(entries) > 1:
            owners = " and ".join(f"{e.plugin.source} as {e.target_ref!r}" for e in entries)
            raise NameConflict(
                f"{kind} {name!r} is registered by more than one plugin: {owners}. Uninstall one "
                "of them, or name the target directly in the manifest as 'module:attr'."
            )
        return entries[0]

    def load(self, kind: Kind, name: str) -> Any:
        """The object registered as ``name`` (lazy targets are imported now)."""
        return self.get(kind, name).load()

    def _not_registered_message(self, kind: Kind, name: str) -> str:
        installed = self.names(kind)
        parts = [f"no {kind} named {name!r} is registered."]
        close = difflib.get_close_matches(name, installed, n=5, cutoff=0.6)
        if close:
            parts.append("Did you mean " + " or ".join(repr(c) for c in close) + "?")
        elif len(installed) <= 5:
            parts.append(f"Installed {kind}s: {', '.join(installed) if installed else 'none'}.")
        else:
            parts.append(f"{len(installed)} {kind}s are installed (agilerl {kind}s list).")
        other_kinds = [k for k in HOOK_OF_KIND if k != kind and name in self._entries[k]]
        if other_kinds:
            parts.append(f"{name!r} is registered, but as another kind: {', '.join(other_kinds)}.")
        broken = [p for p in self.plugins if p.error]
        if broken:
            parts.append(
                "Plugins that failed to load (see `agilerl plugins list`): "
                + "; ".join(f"{p.name}: {p.error}" for p in broken)
                + "."
            )
        parts.append(
            "Install the plugin that provides it, or name the target directly as 'module:attr' "
            "or 'path/to/file.py:attr'."
        )
        return " ".join(parts)


def _describe(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        args = [*map(repr, obj.args), *(f"{k}={v!r}" for k, v in obj.keywords.items())]
        return f"{_describe(obj.func)}({', '.join(args)})"
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}:{qualname}"


def build_registry(pm: pluggy.PluginManager, loaded: list[PluginInfo]) -> Registry:
    """Run each registered plugin's hooks; record hook errors and conflicts on its record."""
    infos = [replace(info, hooks=[], provides={}, conflicts=[]) for info in loaded]
    # Only plugins that loaded cleanly are in the manager (a duplicate entry-point name is not).
    registered = {info.name: info for info in infos if info.error is None}
    registry = Registry(infos)
    hooked: list[_PluginHooks] = []
    for name, plugin in pm.list_name_plugin():
        info = registered.get(name)
        if info is None:  # registered in-process with pm.register (tests, notebooks)
            info = PluginInfo(name=name, module=getattr(plugin, "__name__", None))
            infos.append(info)
        hooked.append(_PluginHooks(pm, plugin, info))
    # every plugin's hooks at once, each plugin bounded: N slow plugins cost one timeout, not N;
    # the entries are added in the plugins' order, so the registry is the same every time
    ran = call_plugin_codes([hooks.run for hooks in hooked], deadlines=[not h.info.builtin for h in hooked])
    for hooks, outcome in zip(hooked, ran):
        for entry in hooks.entries(outcome):
            registry.add(entry)
    for (kind, name), entries in registry.conflicts().items():
        for entry in entries:
            others = ", ".join(e.plugin.source for e in entries if e is not entry)
            entry.plugin.conflicts.append(f"{kind} {name!r} also registered by {others}")
    return registry


def check_strict(registry: Registry) -> None:
    """Under ``AGILERL_STRICT_PLUGINS=1`` a broken or conflicting plugin is an error."""
    if not strict_plugins():
        return
    problems = [f"{p.name}: {p.error}" for p in registry.plugins if p.error]
    problems += [f"{p.name}: {c}" for p in registry.plugins for c in p.conflicts]
    if problems:
        causes = "; ".join(problem.rstrip(".") for problem in problems)
        raise StrictPluginsError(f"{STRICT_ENV_VAR} is set and plugins failed: {causes}.")


class _PluginHooks:
    """One plugin's registering hooks: :meth:`run` calls them all (on a plugin thread) into its
    own staged entries; :meth:`entries` reads the outcome into the plugin's record."""

    def __init__(self, pm: pluggy.PluginManager, plugin: object, info: PluginInfo) -> None:
        self.info = info
        self.staged: dict[tuple[Kind, str], Entry] = {}  # one lookup per name: registration stays linear
        self.current = ""  # the hook running now, named when it fails or hangs
        callers = pm.get_hookcallers(plugin) or []
        info.hooks = sorted(caller.name for caller in callers)
        unknown = [c.name for c in callers if not c.has_spec() and not _all_optional(c, plugin)]
        # What pluggy's check_pending reports, scoped to one plugin so a typo fails only it.
        self.unknown = "; ".join(_unknown_hook_message(name) for name in sorted(unknown))
        self.calls = [
            (caller.name, impl, _register_callback(KIND_OF_HOOK[caller.name], info, self.staged))
            for caller in ([] if unknown else callers)
            if caller.name in KIND_OF_HOOK
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin
        ]

    def run(self) -> None:
        for hook, impl, register in self.calls:
            self.current = hook
            impl.function(*[{"register": register}[arg] for arg in impl.argnames])

    def entries(self, outcome: Outcome) -> list[Entry]:
        info = self.info
        if self.unknown:
            info.error = self.unknown
            return []
        if outcome.timed_out:
            info.error = f"{self.current} {outcome.error}"
            warn_skipped(info)
            return []
        if outcome.error is not None:  # a plugin's bug (even a SystemExit) drops only that plugin
            info.error = f"{self.current} raised {outcome.error}"
            return []
        for entry in self.staged.values():
            info.provides.setdefault(entry.kind, []).append(entry.name)
        return list(self.staged.values())


def _all_optional(caller: pluggy.HookCaller, plugin: object) -> bool:
    return all(impl.optionalhook for impl in caller.get_hookimpls() if impl.plugin is plugin)


def _unknown_hook_message(hook: str) -> str:
    close = difflib.get_close_matches(hook, list(KIND_OF_HOOK), n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"agilerl's hooks are: {', '.join(KIND_OF_HOOK)}"
    return f"unknown hook {hook!r} ({hint})"


def _register_callback(kind: Kind, info: PluginInfo, staged: dict[tuple[Kind, str], Entry]) -> Any:
    def register(name: str, target: Any, *, description: str = "") -> None:
        if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
            raise RegistrationError(
                f"{kind} name {shown_name(name)} is {len(name):,} characters long; names are at most "
                f"{MAX_NAME_LENGTH}."
            )
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise RegistrationError(
                f"{kind} name {shown_name(name)} is invalid: names are lower case, start with a letter or "
                "digit and use only a-z 0-9 . _ / - (a ':' would read as 'module:attr')."
            )
        if isinstance(target, str) and not is_reference(target):
            raise RegistrationError(
                f"{kind} {name!r}: target {shown_name(target)} must be an object or a 'module:attr' string."
            )
        if (kind, name) in staged:
            raise RegistrationError(f"{kind} {name!r} is registered twice by the same plugin.")
        staged[kind, name] = Entry(kind, name, target, description, info)

    return register
