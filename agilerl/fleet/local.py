"""``provider: local``: each replica is an ``agilerl serve`` process on this machine, on loopback.

A replica runs in a session of its own (a terminal's Ctrl-C reaches the trainer, which stops it)
and watches the trainer's pid (``--parent-pid``), so even a trainer killed with SIGKILL leaves
no replica behind for longer than half a second.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import ClassVar

from agilerl.errors import InvalidArgument
from agilerl.fleet.health import wait_healthy
from agilerl.fleet.isolation import EnvRuntime, prepare_env, serve_argv, serve_environ
from agilerl.fleet.provider import Replica, ReplicaSpec, ReplicaStartError

__all__ = ["LocalProvider"]

STOP_GRACE_S = 5.0
"""How long a replica has to stop after SIGTERM before it is killed."""


class LocalProvider:
    """Replicas as local server processes, from the trainer's python or the env's venv."""

    name: ClassVar[str] = "local"

    def __init__(self, spec: ReplicaSpec | None = None, *, offline: bool = False) -> None:
        self.offline = offline
        self._runtime: EnvRuntime | None = None
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._folder: Path | None = None
        self._count = 0
        self._closed = False

    def runtime(self, spec: ReplicaSpec) -> EnvRuntime:
        """The env's python, prepared once for every replica of this provider."""
        with self._lock:
            if self._runtime is None:
                self._runtime = prepare_env(spec, offline=self.offline)
            return self._runtime

    def start(self, spec: ReplicaSpec, index: int, timeout_s: float) -> Replica:
        runtime = self.runtime(spec)
        with self._lock:
            if self._closed:
                raise ReplicaStartError("the fleet is closed: no replica starts", retryable=False)
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="agilerl-fleet-"))
            self._count += 1
            stem = self._folder / f"replica-{index}-{self._count}"
        port_file, log_path = Path(f"{stem}.url"), Path(f"{stem}.log")
        argv = serve_argv(spec, runtime, 0, port_file=str(port_file), parent_pid=os.getpid())
        env = serve_environ(runtime)
        if not Path(spec.base_dir).is_dir():
            raise InvalidArgument(f"the env's base_dir {spec.base_dir!r} is not a folder")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=spec.base_dir, env=env, start_new_session=True,
            )
        with self._lock:
            self._running[process.pid] = process
        deadline = time.monotonic() + timeout_s
        try:
            url = self._await_url(process, port_file, log_path, index, deadline)
            wait_healthy(url, deadline - time.monotonic())
        except ReplicaStartError:
            self._terminate(process)
            raise
        except TimeoutError as exc:
            self._terminate(process)
            raise ReplicaStartError(f"replica {index} listened at {url} but {exc}", retryable=True) from None
        where = f"pid {process.pid} in {runtime.describe()}"
        return Replica(url=url.replace("http://", "ws://", 1), where=where, handle=process)

    def alive(self, replica: Replica) -> bool:
        return replica.handle.poll() is None

    def stop(self, replica: Replica) -> None:
        self._terminate(replica.handle)

    def close(self) -> None:
        """Stop every replica this provider started, then remove its logs (idempotent)."""
        with self._lock:
            self._closed = True
            running = list(self._running.values())
        for process in running:
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in running:
            self._terminate(process, max(0.0, deadline - time.monotonic()), signalled=True)
        with self._lock:
            folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _await_url(self, process: subprocess.Popen[bytes], port_file: Path, log: Path, index: int, deadline: float) -> str:
        """The URL the replica writes once it listens; its log's tail when it exits first."""
        delay = 0.01
        while True:
            if port_file.is_file():
                return port_file.read_text().strip()
            code = process.poll()
            if code is not None:
                tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-12:])
                raise ReplicaStartError(
                    f"replica {index} ({' '.join(process.args[:5])} ...) exited with code {code} "
                    f"before it listened; it said:\n{tail}",
                    retryable=False,
                )
            if time.monotonic() > deadline:
                raise ReplicaStartError(f"replica {index} did not listen within the start timeout", retryable=True)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    def _terminate(self, process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S, *, signalled: bool = False) -> None:
        """SIGTERM to the replica's process group, SIGKILL after ``grace_s``; reaped either way."""
        if not signalled:
            _signal(process, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            process.wait()
        with self._lock:
            self._running.pop(process.pid, None)


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the replica and whatever it started (its own process group)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
