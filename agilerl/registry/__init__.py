"""Plugins and name resolution: the pluggy manager, the hooks, entry-point discovery, the
registry of envs, processors, rubrics and algorithms, and on-demand installs with uv.

``resolve`` is the one entry point the rest of the package calls.
"""

from __future__ import annotations

from agilerl.registry.loading import is_reference, load_object
from agilerl.registry.plugins import ENTRY_POINT_GROUP, PluginInfo
from agilerl.registry.registry import (
    Entry,
    Kind,
    Registry,
)
from agilerl.registry.resolver import (
    get_plugin_manager,
    get_registry,
    reset_registry,
    resolve,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Entry",
    "Kind",
    "PluginInfo",
    "Registry",
    "get_plugin_manager",
    "get_registry",
    "is_reference",
    "load_object",
    "reset_registry",
    "resolve",
]
