"""Where env replicas run: the ``Provider`` protocol every provider (local processes, Ray actors)
implements, and the ``ReplicaSpec`` each replica is built from.

A provider starts, watches and stops servers speaking OpenEnv's protocol; the ``Fleet`` decides
how many, replaces the dead and balances sessions over them. A spec is plain JSON, so a provider
can rebuild it on another machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from agilerl.errors import ReplicaStartError

__all__ = ["Provider", "Replica", "ReplicaSpec", "ReplicaStartError"]


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica serves; JSON-able so a remote node can rebuild it."""

    environment: dict[str, Any]
    """The manifest's ``environment:`` section (``model_dump(mode="json")``)."""
    base_dir: str
    """The manifest's folder (``file.py:attr`` entrypoints resolve there)."""
    max_concurrent_envs: int
    """The sessions one replica serves at once."""


@dataclass
class Replica:
    """One running server of a fleet."""

    url: str
    """``ws://127.0.0.1:PORT``: what ``RemoteEnvClient`` takes."""
    where: str
    """For humans: ``pid 123 in ~/.cache/agilerl/envs/<hash>``, ``ray node <id>``."""
    handle: Any
    """Provider-private (a ``Popen``, an actor handle)."""


@runtime_checkable
class Provider(Protocol):
    """Starts and stops the replicas of one fleet; ``close`` leaves nothing it started behind."""

    name: ClassVar[str]

    def start(self, spec: ReplicaSpec, index: int, timeout_s: float) -> Replica:
        """Start replica ``index``; returns once its ``/health`` answers, else raises
        ``ReplicaStartError`` (``retryable`` when another try can succeed)."""
        ...

    def alive(self, replica: Replica) -> bool:
        """Whether the replica's process (actor) still runs; cheap, called on every health tick."""
        ...

    def stop(self, replica: Replica) -> None:
        """Stop one replica (idempotent); its sessions end."""
        ...

    def close(self) -> None:
        """Stop everything this provider started (idempotent)."""
        ...
