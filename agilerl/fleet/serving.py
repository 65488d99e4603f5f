"""``resolve_env`` with ``isolation``: serve an env in the background from this interpreter, or
from a uv venv of its own (its packages never touch the caller's)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.errors import InvalidArgument
from agilerl.remote.hosting import resolve_env as _serve_here
from agilerl.remote.limits import DEFAULT_MAX_CONCURRENT_ENVS

__all__ = ["IsolatedServer", "resolve_env"]


class IsolatedServer:
    """An env served from its venv by a local process; ``stop()`` (or ``with``) ends it."""

    def __init__(self, provider: Any, replica: Any) -> None:
        self._provider = provider
        self.replica = replica
        self.url = replica.url.replace("ws://", "http://", 1)
        weakref.finalize(self, provider.close)  # dropped, or the process exits: the server stops

    @property
    def active_sessions(self) -> int:
        from agilerl.fleet.health import metadata_of

        return int(metadata_of(self.url).get("active_sessions", 0))

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server process (idempotent)."""
        self._provider.close()

    def __enter__(self) -> IsolatedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def resolve_env(
    entrypoint: str | Callable[..., Any],
    env_config: dict[str, Any] | None = None,
    *,
    isolation: str = "none",
    env_packages: list[str] | None = None,
    base_dir: str | Path | None = None,
    max_concurrent_envs: int = DEFAULT_MAX_CONCURRENT_ENVS,
    start_timeout_s: float = 300.0,
    **options: Any,
) -> tuple[str, Any]:
    """Serve an env (resolved like a manifest's ``entrypoint``) in the background; ``(url, server)``.

    ``isolation="none"``: in this process (``agilerl.remote.hosting.resolve_env``, which takes
    ``options``: host, port, token, the server's limits). ``"venv"``: from a cached uv venv holding
    ``env_packages`` and this agilerl, as ``isolation: venv`` in a manifest, on a free loopback port.
    """
    if isolation == "none":
        return _serve_here(entrypoint, env_config, env_packages=env_packages, base_dir=base_dir,
                          max_concurrent_envs=max_concurrent_envs, **options)
    if isolation != "venv":
        raise InvalidArgument(f"isolation must be 'none' or 'venv', not {isolation!r}")
    if not isinstance(entrypoint, str):
        raise InvalidArgument("isolation='venv' serves an entrypoint named by a string (registered name, "
                              "module:attr or file.py:attr): an object of this process cannot move to the venv")
    if options:
        raise InvalidArgument(f"isolation='venv' serves on a free loopback port with the server's defaults; "
                              f"it takes no {', '.join(sorted(options))}")
    from agilerl.fleet.local import LocalProvider
    from agilerl.fleet.provider import ReplicaSpec

    environment = {"entrypoint": entrypoint, "env_config": dict(env_config or {}), "isolation": "venv",
                   "env_packages": {"uv": list(env_packages or [])}}
    spec = ReplicaSpec(environment, str(Path(base_dir or ".").resolve()), max_concurrent_envs)
    provider = LocalProvider(spec)
    try:
        replica = provider.start(spec, 0, start_timeout_s)
    except BaseException:
        provider.close()
        raise
    server = IsolatedServer(provider, replica)
    return server.url, server
