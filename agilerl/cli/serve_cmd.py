"""``agilerl serve ENTRYPOINT``: host an env over OpenEnv's WebSocket protocol until stopped."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agilerl.cli.args import json_object
from agilerl.errors import AgileRLError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="Serve an env over the OpenEnv WebSocket protocol (for env_url manifests).",
        description="ENTRYPOINT is a registered env name, module:attr or file.py:attr. The server "
        "listens on 127.0.0.1 unless --host says otherwise; with --token (or AGILERL_ENV_TOKEN) "
        "every request must carry 'Authorization: Bearer <token>'.",
    )
    parser.add_argument("entrypoint")
    parser.add_argument("--env-config", type=json_object, default={}, help="JSON keyword arguments.")
    parser.add_argument("--env-package", action="append", dest="env_packages", metavar="PKG",
                        help="Install PKG (with uv) if the entrypoint cannot be imported; repeatable.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default: loopback only).")
    parser.add_argument("--port", type=int, default=8000, help="Port (0 picks a free one; default: 8000).")
    parser.add_argument("--max-concurrent-envs", type=int, default=64, help="Session limit (default: 64).")
    parser.add_argument("--session-timeout", type=float, default=None, metavar="S",
                        help="Close sessions idle for S seconds (default: never).")
    parser.add_argument("--token", default=None, help="Bearer token required on every route.")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from agilerl.remote.hosting import build_server

    if args.token is not None and not args.token.strip():
        raise AgileRLError("--token is empty, which would turn authentication off; give a real token or leave --token out.")
    _build_one_env(args)

    server = build_server(
        args.entrypoint,
        args.env_config,
        env_packages=args.env_packages,
        token=args.token,
        host=args.host,
        port=args.port,
        max_concurrent_envs=args.max_concurrent_envs,
        session_timeout_s=args.session_timeout,
    )
    asyncio.run(_run_until_signal(server))
    return 0


def _build_one_env(args: argparse.Namespace) -> None:
    """Build (and close) one env now: a wrong --env-config fails here, not at the first session."""
    from agilerl.envs.entrypoints import entrypoint_factory
    from agilerl.protocol import close_env

    factory = entrypoint_factory(args.entrypoint, args.env_config, install=args.env_packages)
    try:
        env = factory()
    except Exception as exc:  # the env's own constructor: any error is the user's to fix
        raise AgileRLError(
            f"{args.entrypoint} cannot be built with --env-config {json.dumps(args.env_config)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    close_env(env)


async def _run_until_signal(server: Any) -> None:
    import asyncio
    import gc
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start()
    # Everything alive now (modules, the env class) lives as long as the process: frozen, it is
    # never rescanned, so a full collection stops being a ~15 ms pause for every session.
    gc.freeze()
    print(f"serving {server.name} at {url} (WebSocket: {url.replace('http', 'ws', 1)}/ws); "
          "Ctrl-C stops", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    print("stopped", flush=True)
