"""Host any text env behind the OpenEnv WebSocket protocol."""

from agilerl.remote.server import resolve_env

__all__ = ["resolve_env"]
