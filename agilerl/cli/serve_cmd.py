"""``agilerl serve ENTRYPOINT``: host an env over OpenEnv's WebSocket protocol until stopped."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from agilerl.cli.args import add_adapter_flags, adapter_options, json_object, positive_float, positive_int
from agilerl.errors import EnvError
from agilerl.images import DEFAULT_MAX_IMAGE_PIXELS
from agilerl.remote import limits

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="Serve an env over the OpenEnv WebSocket protocol (for env_url manifests).",
        description="ENTRYPOINT is a registered env name, module:attr or file.py:attr. The server "
        f"listens on 127.0.0.1 unless --host says otherwise; with --token (or {limits.TOKEN_ENV_VAR}) "
        "every request must carry 'Authorization: Bearer <token>'.",
    )
    parser.add_argument("entrypoint")
    parser.add_argument("--env-config", type=json_object, default={}, help="JSON keyword arguments.")
    parser.add_argument("--env-package", action="append", dest="env_packages", metavar="PKG",
                        help="Install PKG (with uv) if the entrypoint cannot be imported; repeatable.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default: loopback only).")
    parser.add_argument("--port", type=int, default=8000, help="Port (0 picks a free one; default: 8000).")
    parser.add_argument("--max-concurrent-envs", type=positive_int, default=limits.DEFAULT_MAX_CONCURRENT_ENVS,
                        help=f"Session limit (default: {limits.DEFAULT_MAX_CONCURRENT_ENVS}).")
    parser.add_argument("--session-timeout", type=positive_float, default=None, metavar="S",
                        help="Close sessions idle for S seconds (default: never).")
    parser.add_argument("--token", default=None, help="Bearer token required on every route.")
    parser.add_argument("--isolation", choices=("none", "venv"), default="none",
                        help="venv: serve from a uv venv of the env's own, holding its --env-package packages "
                        "and this agilerl (built once, cached; agilerl env prepared lists them).")
    parser.add_argument("--base-dir", default=None, metavar="DIR",
                        help="Folder a file.py:attr entrypoint is relative to (default: the working directory).")
    parser.add_argument("--port-file", default=None, metavar="PATH",
                        help="Write the bound URL to PATH once listening (with --port 0: how a launcher learns it).")
    parser.add_argument("--parent-pid", type=positive_int, default=None, metavar="PID",
                        help="Stop when process PID ends (a fleet's replica outlives no trainer, even a killed one).")
    # the loop kinds are checked by agilerl.concurrency, imported only to serve: --help stays light
    parser.add_argument("--loop", default=None, metavar="{auto,uvloop,asyncio}",
                        help="Event loop (default: $AGILERL_EVENT_LOOP, else auto: uvloop when installed).")
    adapter = parser.add_argument_group(
        "OpenEnv envs", "An OpenEnv env is served in its own terms (clients send its Action's fields); "
        "these say how text sent by a text client (agilerl's, its action_field) fills the Action. "
        "They may also be keys of --env-config."
    )
    add_adapter_flags(adapter)
    connections = parser.add_argument_group(
        "connection limits", "What a slow, silent or flooding client may hold (the server's defaults shown)."
    )
    for flag, kind, option, default, what in _LIMITS:
        connections.add_argument(flag, type=kind, dest=option, default=default,
                                 metavar="S" if kind is positive_float else "N",
                                 help=f"{what} (default: {default})." if default is not None else f"{what}.")
    parser.set_defaults(handler=_serve)


_LIMITS = [  # flag, type, EnvServer keyword, default, what it bounds
    ("--header-timeout", positive_float, "header_timeout_s", limits.DEFAULT_HEADER_TIMEOUT_S,
     "Seconds a new connection has to send its request head (then 408)"),
    ("--keepalive-timeout", positive_float, "keepalive_timeout_s", limits.DEFAULT_KEEPALIVE_TIMEOUT_S,
     "Seconds an idle keep-alive HTTP connection stays open"),
    ("--send-timeout", positive_float, "send_timeout_s", limits.DEFAULT_SEND_TIMEOUT_S,
     "Seconds a reply may wait for a peer that does not read (then the connection is aborted)"),
    ("--close-timeout", positive_float, "close_timeout_s", limits.DEFAULT_CLOSE_TIMEOUT_S,
     "Seconds a closing handshake may take (then the connection is aborted)"),
    ("--heartbeat", positive_float, "heartbeat_s", limits.DEFAULT_HEARTBEAT_S,
     "A session silent this many seconds is pinged, and closed without a pong within half that"),
    ("--max-connections", positive_int, "max_connections", None,
     "Open connections, then 503 (default: 2 x --max-concurrent-envs + 64)"),
    ("--backlog", positive_int, "backlog", limits.DEFAULT_BACKLOG, "Connections queued before accept"),
    ("--max-message-bytes", positive_int, "max_message_bytes", limits.DEFAULT_MAX_MESSAGE_BYTES,
     "Largest WebSocket message accepted"),
    ("--max-image-pixels", positive_int, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS,
     "Most pixels an image the env shows may have (checked before it is encoded)"),
]


def _serve(args: argparse.Namespace) -> int:
    from agilerl.concurrency import loop_kind, run
    from agilerl.remote.hosting import build_server

    kind = loop_kind(args.loop)  # a wrong --loop fails before anything is built
    if args.isolation == "venv":
        _exec_in_venv(args)
    # checked (and a trailing newline stripped) before anything is built: a token that no
    # client could send must not start a server that refuses everyone
    if args.token is not None:
        args.token = limits.clean_token(args.token, "--token")
    else:
        args.token = limits.clean_token(os.environ.get(limits.TOKEN_ENV_VAR) or None, f"${limits.TOKEN_ENV_VAR}")
    args.max_concurrent_envs = _build_one_env(args)

    server = build_server(
        args.entrypoint,
        args.env_config,
        env_packages=args.env_packages,
        base_dir=args.base_dir,
        token=args.token,
        host=args.host,
        port=args.port,
        max_concurrent_envs=args.max_concurrent_envs,
        session_timeout_s=args.session_timeout,
        adapter=adapter_options(args),
        **{option: getattr(args, option) for _, _, option, _, _ in _LIMITS},
    )
    run(_run_until_signal(server, kind, port_file=args.port_file, parent_pid=args.parent_pid), kind)
    return 0


def _exec_in_venv(args: argparse.Namespace) -> None:
    """Become ``agilerl serve`` in the env's venv (built first when it is not cached), with the
    same flags: the env's packages never touch this interpreter."""
    from agilerl.fleet.isolation import prepare_env, serve_argv, serve_environ
    from agilerl.fleet.provider import ReplicaSpec

    environment: dict[str, Any] = {
        "entrypoint": args.entrypoint, "env_config": args.env_config, "isolation": "venv",
        "env_packages": {"uv": list(args.env_packages or [])}, **adapter_options(args),
    }
    spec = ReplicaSpec(environment, os.path.abspath(args.base_dir or "."), args.max_concurrent_envs)
    runtime = prepare_env(spec)
    argv = serve_argv(spec, runtime, args.port, port_file=args.port_file, parent_pid=args.parent_pid)
    argv += ["--host", args.host] + (["--loop", args.loop] if args.loop else [])
    if args.session_timeout is not None:
        argv += ["--session-timeout", str(args.session_timeout)]
    for flag, _, option, _, _ in _LIMITS:
        if getattr(args, option) is not None:
            argv += [flag, str(getattr(args, option))]
    env = serve_environ(runtime)
    if args.token:  # by the environment, not the command line other users can read
        env[limits.TOKEN_ENV_VAR] = args.token
    print(f"serving from venv {runtime.venv}", file=sys.stderr, flush=True)
    os.execve(runtime.python, argv, env)


def _build_one_env(args: argparse.Namespace) -> int:
    """Build (and close) one env now: a wrong --env-config fails here, not at the first session.
    Returns the session limit the env allows (``SUPPORTS_CONCURRENT_SESSIONS``), said at start-up."""
    from agilerl.envs.entrypoints import entrypoint_factory
    from agilerl.protocol import close_env
    from agilerl.remote.lifecycle import concurrency_limit

    factory = entrypoint_factory(
        args.entrypoint, dict(args.env_config), base_dir=args.base_dir, install=args.env_packages,
        options_in_config=True, **adapter_options(args),
    )
    try:
        env = factory()
    except Exception as exc:  # the env's own constructor: any error is the user's to fix
        raise EnvError(
            f"{args.entrypoint} cannot be built with --env-config {json.dumps(args.env_config)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    try:
        limit, why = concurrency_limit(env, args.max_concurrent_envs)
    finally:
        close_env(env)
    if why is not None:
        print(f"note: {why}", file=sys.stderr, flush=True)
    return limit


async def _run_until_signal(
    server: Any, loop_name: str, *, port_file: str | None = None, parent_pid: int | None = None
) -> None:
    import asyncio
    import gc

    from agilerl.concurrency import stop_signals

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():  # a closed terminal stops it cleanly too, unless under nohup
        loop.add_signal_handler(sig, stop.set)
    watch = asyncio.ensure_future(_watch_parent(parent_pid, stop)) if parent_pid else None
    url = await server.start()
    if port_file:  # written whole, then renamed: a launcher polling for it never reads half a URL
        tmp = f"{port_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            handle.write(url)
        os.replace(tmp, port_file)
    # Everything alive now (modules, the env class) lives as long as the process: frozen, it is
    # never rescanned, so a full collection stops being a ~15 ms pause for every session. And a
    # young-generation pass every 10,000 allocations rather than 700: an MCP env's step (FastMCP,
    # pydantic) allocates hundreds of objects, and the default ran a pass every few steps (6-10%
    # of the MCP case's time; bench/README.md). Garbage in cycles waits a little longer, no more.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    print(f"serving {server.name} at {url} (WebSocket: {url.replace('http', 'ws', 1)}/ws; {loop_name} loop); "
          "Ctrl-C stops", flush=True)
    try:
        await stop.wait()
    finally:
        if watch is not None:
            watch.cancel()
        await server.stop()
    print("stopped", flush=True)


async def _watch_parent(pid: int, stop: Any, interval_s: float = 0.5) -> None:
    """Set ``stop`` once process ``pid`` is gone (reparented away from it, or no such process):
    a launcher killed with SIGKILL cannot stop its servers, so they stop themselves."""
    import asyncio

    child = os.getppid() == pid  # its child: reparented means it died (even as an unreaped zombie)
    while not stop.is_set():
        if child:
            gone = os.getppid() != pid
        else:
            try:
                os.kill(pid, 0)
                gone = False
            except ProcessLookupError:
                gone = True
            except PermissionError:  # alive, someone else's
                gone = False
        if gone:
            stop.set()
            return
        await asyncio.sleep(interval_s)
