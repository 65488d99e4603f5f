"""Env clients (in-process, and remote over OpenEnv's WebSocket protocol) and the adapter that
runs an OpenEnv ``Environment`` class in process as a text env (loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agilerl.llm_envs._lazy import lazy_exports

_LAZY = {
    "InProcessEnvClient": "agilerl.envs.client",
    "RemoteEnvClient": "agilerl.remote.client",
    "adapt_openenv": "agilerl.envs.openenv_native",
    "RemoteEnvError": "agilerl.errors",
    "RemoteEnvTimeout": "agilerl.errors",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

if TYPE_CHECKING:
    from agilerl.envs.client import InProcessEnvClient
    from agilerl.envs.openenv_native import adapt_openenv
    from agilerl.errors import RemoteEnvError, RemoteEnvTimeout
    from agilerl.remote.client import RemoteEnvClient
