"""Env fleets: replicas of one env served outside the trainer (local processes, Ray actors),
in the trainer's interpreter or a uv venv of the env's own, balanced and healed by ``Fleet``.

``PROVIDERS`` maps a manifest's ``provider:`` to its class as ``"module:attr"``, imported only
when a run uses it (Ray is an extra)."""

from __future__ import annotations

from agilerl.fleet.provider import Provider, Replica, ReplicaSpec, ReplicaStartError

__all__ = ["PROVIDERS", "Provider", "Replica", "ReplicaSpec", "ReplicaStartError"]

PROVIDERS: dict[str, str] = {
    "local": "agilerl.fleet.local:LocalProvider",
    "ray": "agilerl.fleet.ray_provider:RayProvider",
}
"""``provider:`` name -> ``"module:Class"``; a class is built as ``Class(spec)`` (a ``ReplicaSpec``),
so it reads its own options (Ray's ``address``) from ``spec.environment``."""
