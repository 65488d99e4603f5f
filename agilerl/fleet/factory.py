"""An ``entrypoint`` env served outside the trainer: its fleet started, and a factory of remote
clients that share it (``provider: local | ray``, or ``isolation: venv``)."""

from __future__ import annotations

import weakref
from importlib import import_module
from pathlib import Path
from typing import Any

from agilerl.errors import InvalidArgument
from agilerl.fleet.fleet import Fleet, Scaler
from agilerl.fleet.limits import StartLimiter
from agilerl.fleet.provider import Provider, ReplicaSpec
from agilerl.manifest.environment import EntrypointSpec
from agilerl.remote.limits import DEFAULT_MAX_CONCURRENT_ENVS

__all__ = ["FleetEnvFactory", "fleet_env_factory", "make_provider", "replica_spec"]


def replica_spec(spec: EntrypointSpec, base_dir: str | Path | None = None) -> ReplicaSpec:
    """What every replica of ``spec``'s env serves, as JSON a remote node can rebuild."""
    return ReplicaSpec(
        environment=spec.model_dump(mode="json", by_alias=False, exclude_none=True),
        base_dir=str(Path(base_dir or ".").resolve()),
        max_concurrent_envs=spec.max_concurrent_envs or DEFAULT_MAX_CONCURRENT_ENVS,
    )


def make_provider(name: str, spec: ReplicaSpec) -> Provider:
    """The provider registered as ``name`` in ``PROVIDERS``, built for ``spec``."""
    from agilerl.fleet import PROVIDERS

    if name not in PROVIDERS:
        raise InvalidArgument(f"environment.provider {name!r} is not one of: {', '.join(PROVIDERS)}")
    module, _, attr = PROVIDERS[name].partition(":")
    cls = getattr(import_module(module), attr)  # a provider imports its extra (Ray) when built: MissingExtra
    return cls(spec)


class FleetEnvFactory:
    """Each call: a ``RemoteEnvClient`` whose sessions the fleet places. ``close`` stops the
    fleet; so does dropping the factory and every client it made (and the process's exit)."""

    def __init__(self, fleet: Fleet, client_options: dict[str, Any]) -> None:
        self.fleet = fleet
        self._options = client_options
        weakref.finalize(self, fleet.close)

    def __call__(self) -> Any:
        from agilerl.remote.client import RemoteEnvClient

        client = RemoteEnvClient(self.fleet.urls, picker=self, **self._options)
        self.fleet.client_made(client)
        return client

    # the client's picker: the fleet's, through this object, so a client keeps the fleet alive
    def pick(self) -> str:
        return self.fleet.pick()

    def released(self, url: str) -> None:
        self.fleet.released(url)

    def failed(self, url: str) -> None:
        self.fleet.failed(url)

    def close(self) -> None:
        self.fleet.close()

    @property
    def where(self) -> str:
        return self.fleet.describe()


def fleet_env_factory(
    spec: EntrypointSpec, *, base_dir: str | Path | None = None, sessions: int | None = None
) -> FleetEnvFactory:
    """Start ``spec``'s fleet (``spec.placement``: local or ray) and return its client factory;
    ``sessions``, the sessions the run holds at once when known, sizes ``replicas: auto``."""
    rspec = replica_spec(spec, base_dir)
    provider = make_provider(spec.placement, rspec)
    scaler: Scaler | None = None
    size = spec.replicas
    if size == "auto":
        from agilerl.fleet.autoscale import autoscaler

        size, scaler = autoscaler(rspec, sessions)
    limiter = StartLimiter(spec.max_starts_per_s)
    fleet = Fleet(rspec, provider, size, scaler=scaler, limiter=limiter).start()  # closed again if it fails
    return FleetEnvFactory(fleet, {"request_timeout_s": spec.request_timeout_s})
