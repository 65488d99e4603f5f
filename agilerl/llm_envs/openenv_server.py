"""Host any text env behind the OpenEnv WebSocket protocol."""

from agilerl.core.remote.server import resolve_env

__all__ = ["resolve_env"]
