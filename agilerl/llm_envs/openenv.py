"""Env clients: in-process and remote (OpenEnv WebSocket protocol)."""

from agilerl.core.client import InProcessEnvClient
from agilerl.core.remote.client import RemoteEnvClient

__all__ = ["InProcessEnvClient", "RemoteEnvClient"]
