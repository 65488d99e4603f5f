"""Env clients: in-process and remote (OpenEnv WebSocket protocol)."""

from agilerl.envs.client import InProcessEnvClient
from agilerl.remote.client import RemoteEnvClient

__all__ = ["InProcessEnvClient", "RemoteEnvClient"]
