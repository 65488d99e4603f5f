"""OpenEnv's classes recognised without importing openenv: an object of theirs can only exist once
its module imported openenv, so a class is known by the (module, name) pairs in its MRO.

The one test of an OpenEnv base, shared by the env adapter (``openenv_native``) and the rubric
reader (``openenv_rubrics``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENVIRONMENT", "MCP_ENVIRONMENT", "ACTION", "RUBRIC", "TRAJECTORY_RUBRIC", "has_base"]

ENVIRONMENT = ("openenv.core.env_server.interfaces", "Environment")
MCP_ENVIRONMENT = ("openenv.core.env_server.mcp_environment", "MCPEnvironment")
ACTION = ("openenv.core.env_server.types", "Action")
RUBRIC = ("openenv.core.rubrics.base", "Rubric")
TRAJECTORY_RUBRIC = ("openenv.core.rubrics.trajectory", "TrajectoryRubric")


def has_base(obj: Any, base: tuple[str, str]) -> bool:
    """True when ``obj`` (a class or an instance) has OpenEnv's ``base`` among its classes."""
    klass = obj if isinstance(obj, type) else type(obj)
    return any((c.__module__, c.__name__) == base for c in getattr(klass, "__mro__", ()))
