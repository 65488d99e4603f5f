"""agilerl: the environment layer for training LLMs with reinforcement learning.

Importing this package is cheap on purpose: torch, transformers and datasets load only when a
name that needs them is first used. These are the few top-level names; ``agilerl.llm_envs``
holds the whole documented surface (these names included).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("agilerl")
"""Decorator for plugin hook implementations: ``@hookimpl def register_envs(register): ...``."""

_LAZY = {
    "TextEnv": "agilerl.protocol",
    "check_env": "agilerl.envs.checker",
    "load_manifest": "agilerl.manifest.spec",
    "InProcessEnvClient": "agilerl.envs.client",
    "RemoteEnvClient": "agilerl.remote.client",
    "RolloutHarness": "agilerl.rollout.harness",
    "AgileRLError": "agilerl.errors",
    "Register": "agilerl.registry.hookspecs",
}

__all__ = ["__version__", "hookimpl", *_LAZY]

if TYPE_CHECKING:
    from agilerl.envs.checker import check_env
    from agilerl.envs.client import InProcessEnvClient
    from agilerl.errors import AgileRLError
    from agilerl.manifest.spec import load_manifest
    from agilerl.protocol import TextEnv
    from agilerl.remote.client import RemoteEnvClient
    from agilerl.rollout.harness import RolloutHarness


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agilerl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
