"""Running an ``EnvServer``: ``build_server`` for an entrypoint, and ``resolve_env``, which serves
one in the background for plain synchronous code (tests, notebooks, a trainer's own host)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.concurrency import LoopThread
from agilerl.remote.limits import DEFAULT_MAX_CONCURRENT_ENVS, TOKEN_ENV_VAR, clean_token
from agilerl.remote.server import EnvServer

__all__ = ["RunningServer", "resolve_env", "build_server"]


class RunningServer:
    """An ``EnvServer`` on its own event-loop thread, for plain synchronous code."""

    def __init__(self, server: EnvServer) -> None:
        self.server = server
        self._thread = LoopThread(f"agilerl-env-server-{server.name}")
        try:
            self.url = self._thread.run(server.start())
        except BaseException:
            self._thread.stop()
            raise
        self._stopped = False

    @property
    def active_sessions(self) -> int:
        return self.server.active_sessions

    def stop(self, grace_s: float = 10.0) -> None:
        """Close every session and env, free the port, end the thread (idempotent); env calls
        in flight are abandoned, env closes get up to ``grace_s``."""
        if self._stopped:
            return
        self._stopped = True
        self._thread.run(self.server.stop(grace_s))
        self._thread.stop()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def resolve_env(
    entrypoint: str | Callable[..., Any],
    env_config: dict[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_concurrent_envs: int = DEFAULT_MAX_CONCURRENT_ENVS,
    session_timeout_s: float | None = None,
    token: str | None = None,
    base_dir: str | Path | None = None,
    env_packages: list[str] | None = None,
    **server_options: Any,
) -> tuple[str, RunningServer]:
    """Serve an env (resolved like a manifest's ``entrypoint``) in the background.

    Returns ``(url, server)``; ``server.stop()`` (or ``with server:``) shuts it down.
    ``server_options`` go to ``EnvServer`` (``heartbeat_s``, ``max_message_bytes``, the
    connection limits: ``header_timeout_s``, ``send_timeout_s``, ``max_connections``, ...).
    """
    server = build_server(
        entrypoint, env_config, host=host, port=port, max_concurrent_envs=max_concurrent_envs,
        session_timeout_s=session_timeout_s, token=token, base_dir=base_dir,
        env_packages=env_packages, **server_options,
    )
    running = RunningServer(server)
    return running.url, running


def build_server(
    entrypoint: str | Callable[..., Any],
    env_config: dict[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
    env_packages: list[str] | None = None,
    token: str | None = None,
    adapter: dict[str, Any] | None = None,
    **options: Any,
) -> EnvServer:
    """An ``EnvServer`` for ``entrypoint``; the token defaults to ``$AGILERL_ENV_TOKEN``.
    ``adapter``: an OpenEnv env's adapter options (``action_field``, ...; also taken from
    ``env_config`` where the env's constructor has no such argument)."""
    from agilerl.envs.entrypoints import entrypoint_factory

    factory = entrypoint_factory(
        entrypoint, env_config, base_dir=base_dir, install=env_packages, options_in_config=True, **(adapter or {})
    )
    name = entrypoint if isinstance(entrypoint, str) else getattr(entrypoint, "__qualname__", repr(entrypoint))
    if not token:
        token = clean_token(os.environ.get(TOKEN_ENV_VAR) or None, f"${TOKEN_ENV_VAR}")
    return EnvServer(factory, name=name, token=token, **options)
