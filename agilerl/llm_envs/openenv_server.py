"""Host any text env behind OpenEnv's WebSocket protocol (loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agilerl.llm_envs._lazy import lazy_exports

_LAZY = {
    "resolve_env": "agilerl.fleet.serving",  # isolation="venv" too; else agilerl.remote.hosting
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

if TYPE_CHECKING:
    from agilerl.fleet.serving import resolve_env
