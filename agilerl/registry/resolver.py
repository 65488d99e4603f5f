"""The process-wide plugin manager and registry, built on first use (never at ``import
agilerl``), and :func:`resolve`, the one function the package calls to turn a name into an object.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import pluggy

from agilerl.errors import LoadError, ModuleNotImportable, NameNotRegistered
from agilerl.registry.loading import file_without_attr_message, is_reference, load_object
from agilerl.registry.openenv_packages import add_openenv_packages
from agilerl.registry.plugins import PluginInfo, new_plugin_manager
from agilerl.registry.registry import (
    Kind,
    Registry,
    build_registry,
    check_strict,
)

__all__ = ["get_plugin_manager", "get_registry", "reset_registry", "resolve"]

_lock = threading.RLock()
_manager: tuple[pluggy.PluginManager, list[PluginInfo]] | None = None
_registry: tuple[tuple[int, ...], Registry] | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """The pluggy manager, loading the built-ins and entry points the first time.

    Plugins registered on it with ``pm.register(module)`` appear in the next :func:`get_registry`.
    """
    return _load_manager()[0]


def get_registry() -> Registry:
    """Every registered name and every plugin's status; rebuilt when the set of plugins changes."""
    global _registry
    with _lock:
        pm, loaded = _load_manager()
        key = tuple(id(plugin) for _, plugin in pm.list_name_plugin())
        if _registry is None or _registry[0] != key:
            _registry = (key, add_openenv_packages(build_registry(pm, loaded)))
        registry = _registry[1]
    check_strict(registry)
    return registry


def reset_registry() -> None:
    """Forget loaded plugins, so the next use rediscovers entry points (after an install)."""
    global _manager, _registry
    with _lock:
        _manager = None
        _registry = None


def resolve(
    kind: Kind,
    ref: str,
    *,
    base_dir: str | Path | None = None,
    install: list[str] | None = None,
) -> Any:
    """Turn a registered name, ``module:attr`` or ``file.py:attr`` into the object it names.

    ``install`` (the manifest's ``env_packages``) is installed with uv only when the reference
    cannot be imported or the name is not registered, then the lookup runs once more.
    """
    try:
        return _lookup(kind, ref, base_dir)
    except (ModuleNotImportable, NameNotRegistered):
        if not install:
            raise
    from agilerl.registry.install import install_packages

    install_packages(install)
    importlib.invalidate_caches()
    reset_registry()
    return _lookup(kind, ref, base_dir)


def _lookup(kind: Kind, ref: str, base_dir: str | Path | None) -> Any:
    if is_reference(ref):
        return load_object(ref, base_dir)
    if ref.endswith(".py"):
        raise LoadError(file_without_attr_message(ref, base_dir))
    return get_registry().load(kind, ref)


def _load_manager() -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    global _manager
    with _lock:
        if _manager is None:
            _manager = new_plugin_manager()
        return _manager
