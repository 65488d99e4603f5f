"""``provider: ray``: each replica is a Ray actor that prepares the env on its own node and owns
the ``agilerl serve`` process serving it.

The cluster is ``environment.address`` (else ``$RAY_ADDRESS``), or a local one started for the
run and shut down with it. Nothing outlives the run: ``close`` kills every actor this provider
made, an actor's server is in its own process group and killed with it, and a server whose
actor dies however it dies (``ray.kill``, a lost node, the trainer gone) gets SIGTERM from the
kernel (``PR_SET_PDEATHSIG``). Ray is the ``[ray]`` extra, imported only here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from agilerl.errors import MissingExtra, ReplicaStartError
from agilerl.fleet.health import wait_healthy
from agilerl.fleet.provider import Replica, ReplicaSpec
from agilerl.remote.limits import TOKEN_ENV_VAR

__all__ = ["RayProvider", "ReplicaServer"]

NAMESPACE = "agilerl"
"""The Ray namespace of every replica actor (``ray list actors`` shows them as ``agilerl-env-...``)."""
_CALL_TIMEOUT_S = 10.0
"""Bound on a control call to an actor (alive, stop) that does no real work."""
_STOP_GRACE_S = 10.0
"""How long a server has to close its sessions and envs after SIGTERM, then SIGKILL."""


def _ray() -> Any:
    with MissingExtra.translate("environment.provider: ray"):
        import ray
    return ray


class RayProvider:
    """Replicas as Ray actors (one CPU each, spread over the nodes)."""

    name: ClassVar[str] = "ray"

    def __init__(self, spec: ReplicaSpec) -> None:
        self._ray = _ray()  # a missing extra fails when the fleet is made, before anything starts
        self.address: str | None = spec.environment.get("address") or os.environ.get("RAY_ADDRESS") or None
        replicas = spec.environment.get("replicas")
        self._local_cpus = max(os.cpu_count() or 1, replicas if isinstance(replicas, int) else 1)
        """A local cluster's CPUs: one per replica asked for, at least one per core."""
        self._run = uuid.uuid4().hex[:8]
        self._made = itertools.count()  # actor names are never reused, even while a killed one lingers
        self._lock = threading.Lock()
        self._actors: dict[str, Any] = {}  # name -> handle: everything made, alive or not
        self._placed: set[str] = set()  # the actors that answered (a pending one cannot take a stop call)
        self._here: dict[str, tuple[int, str]] = {}  # name -> its server's pid and folder, on this node
        self._connected = False
        self._owns_connection = False  # ray.init was ours (ray.shutdown is too)
        self._owns_cluster = False  # and it started the cluster: nothing else adds nodes to it
        self._closed = False

    # -- the Provider protocol ------------------------------------------------------------------

    def start(self, spec: ReplicaSpec, index: int, timeout_s: float) -> Replica:
        """A new actor for replica ``index``: it prepares the env on its node and starts the
        server; returns once the server's ``/health`` answers from here."""
        ray = self._ray
        self._connect()
        deadline = time.monotonic() + timeout_s
        if self._owns_cluster and ray.available_resources().get("CPU", 0) < 1:  # would wait for good
            raise ReplicaStartError(
                f"replica {index}: the local Ray cluster started for this run has "
                f"{ray.cluster_resources().get('CPU', 0):g} CPUs, all "
                "held by replicas (each takes one); run fewer replicas, or give environment.address of a "
                "larger cluster",
                retryable=True,  # a replica being replaced frees its CPU a moment later
            )
        with self._lock:
            if self._closed:
                raise ReplicaStartError("the Ray provider is closed; no replica starts after the run ends")
            name = f"agilerl-env-{self._run}-{index}-{next(self._made)}"
            actor = _actor_class(ray).options(
                name=name, namespace=NAMESPACE, num_cpus=1, scheduling_strategy="SPREAD", max_restarts=0
            ).remote(dataclasses.asdict(spec), index, ray.util.get_node_ip_address(), os.environ.get(TOKEN_ENV_VAR))
            self._actors[name] = actor
        try:
            reply = ray.get(actor.serve.remote(timeout_s), timeout=timeout_s + _CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._kill(name)
            raise ReplicaStartError(
                f"replica {index}: no Ray node took its actor, or its server did not start, within "
                f"{timeout_s:g} s (each replica needs 1 free CPU on a node of {self._where()})",
                retryable=True,
            ) from None
        except ray.exceptions.RayError as exc:  # the actor or its node died while starting
            self._kill(name)
            raise ReplicaStartError(f"replica {index}: its Ray actor died while starting: {exc}", retryable=True) from None
        self._placed.add(name)
        if "error" in reply:
            self._kill(name)
            raise ReplicaStartError(f"replica {index} on ray node {reply['node']}: {reply['error']}",
                                    retryable=reply["retryable"])
        url = reply["url"]
        if url.startswith("http://127.0.0.1:"):  # on this node: close() makes sure its server is gone
            self._here[name] = (reply["pid"], reply["folder"])
        try:
            wait_healthy(url, max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            self._kill(name)
            raise ReplicaStartError(
                f"replica {index} serves at {url} on ray node {reply['node']}, but its /health does not "
                "answer from the trainer (a firewall between the nodes, or the node's address is not "
                "reachable from here)",
                retryable=True,
            )
        return Replica(url=url.replace("http://", "ws://", 1), where=f"ray node {reply['node']} ({name})",
                       handle=(name, actor))

    def alive(self, replica: Replica) -> bool:
        """Whether the actor answers and its server process still runs."""
        ray = self._ray
        _, actor = replica.handle
        try:
            return bool(ray.get(actor.alive.remote(), timeout=_CALL_TIMEOUT_S))
        except ray.exceptions.RayError:
            return False

    def stop(self, replica: Replica) -> None:
        """Stop the server (SIGTERM, then SIGKILL past a grace), then kill its actor."""
        self._kill(replica.handle[0])

    def close(self) -> None:
        """Kill every actor this provider made (their servers with them); shut down the local
        cluster it started, or disconnect from the one it joined. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._kill(*self._actors)
        if self._owns_connection:
            self._ray.shutdown()
            self._connected = self._owns_connection = self._owns_cluster = False

    # -- here ------------------------------------------------------------------------------------

    def _connect(self) -> None:
        """Join the cluster (``address``), or start a local one, once; a driver the user already
        connected (``ray.init`` in their own code) is used as it is and left connected."""
        ray = self._ray
        with self._lock:
            if self._connected:
                return
            if ray.is_initialized():
                self._connected = True
                return
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
            if self.address is None:
                kwargs["num_cpus"] = self._local_cpus
            with _keep_signal_handlers():
                ray.init(address=self.address, **kwargs)
            self._connected = self._owns_connection = True
            self._owns_cluster = self.address is None

    def _kill(self, *names: str) -> None:
        """Stop these actors' servers, all at once within one grace, then kill the actors
        (idempotent: one already gone is passed over)."""
        ray = self._ray
        actors = [(name, actor) for name in names if (actor := self._actors.pop(name, None)) is not None]
        # a pending actor (not placed yet) runs nothing, and a call to it would wait for placement
        stops = [actor.stop.remote() for name, actor in actors if name in self._placed]
        self._placed.difference_update(names)
        if stops:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(stops, num_returns=len(stops), timeout=_STOP_GRACE_S + _CALL_TIMEOUT_S)
        for _, actor in actors:
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                ray.kill(actor, no_restart=True)
        # A stop call that did not land leaves the server to PR_SET_PDEATHSIG's SIGTERM when its
        # actor dies: on this node, wait for it (within its grace), then SIGKILL what is left.
        _reap([here for name in names if (here := self._here.pop(name, None)) is not None])

    def _where(self) -> str:
        return self.address or "the local Ray cluster started for this run"


@contextlib.contextmanager
def _keep_signal_handlers() -> Any:
    """``ray.init`` sets SIGTERM to ``sys.exit``: the trainer's own handler (save, then stop) is
    put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _reap(servers: list[tuple[int, str]]) -> None:
    """Wait, up to the stop grace, for these servers (pid, folder: on this node) to exit; SIGKILL
    the process group of any still running. A pid is only signalled while its command line still
    names its replica's folder (pids are reused)."""
    deadline = time.monotonic() + _STOP_GRACE_S
    left = [(pid, folder) for pid, folder in servers if _is_server(pid, folder)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [(pid, folder) for pid, folder in left if _is_server(pid, folder)]
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _is_server(pid: int, folder: str) -> bool:
    """Whether ``pid`` is still running the server whose URL file is in ``folder`` (Linux: from
    /proc; elsewhere it reads as gone, and the actor's own stop is what there is)."""
    try:
        return folder.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()  # a zombie's is empty
    except OSError:
        return False


# -- on the node (inside the actor) -------------------------------------------------------------


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM when the actor's process dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ReplicaServer:
    """The actor's body: prepares the env on this node and owns its ``agilerl serve`` process."""

    def __init__(self, spec: dict[str, Any], index: int, trainer_node: str, token: str | None) -> None:
        self.spec = ReplicaSpec(**spec)
        self.index = index
        self.trainer_node = trainer_node
        self.token = token
        self.proc: subprocess.Popen[bytes] | None = None
        self.folder = Path(tempfile.mkdtemp(prefix=f"agilerl-replica-{index}-"))
        self.log = self.folder / "serve.log"

    def serve(self, timeout_s: float) -> dict[str, Any]:
        """Prepare the env and start its server; ``{"url", "node"}``, or ``{"error", "retryable",
        "node"}`` (plain data: nothing but JSON crosses back)."""
        import ray

        from agilerl.errors import AgileRLError
        from agilerl.fleet.isolation import prepare_env, serve_argv, serve_environ

        node = ray.util.get_node_ip_address()
        host = "127.0.0.1" if node == self.trainer_node else node  # the trainer's own node: loopback only
        deadline = time.monotonic() + timeout_s
        try:
            runtime = prepare_env(self.spec)
        except ReplicaStartError as exc:
            return {"error": str(exc), "retryable": exc.retryable, "node": node}
        except AgileRLError as exc:  # the env's packages, its name: another try fails the same way
            return {"error": f"{type(exc).__name__}: {exc}", "retryable": False, "node": node}
        port_file = self.folder / "url"
        argv = [*serve_argv(self.spec, runtime, port=0, port_file=str(port_file), parent_pid=os.getpid()),
                "--host", host]  # the last --host wins: the node's address, where the trainer reaches it
        env = serve_environ(runtime)
        if self.token:
            env[TOKEN_ENV_VAR] = self.token
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.spec.base_dir if Path(self.spec.base_dir).is_dir() else None,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        while time.monotonic() < deadline:
            if port_file.is_file() and (url := port_file.read_text().strip()):
                return {"url": url, "node": node, "pid": self.proc.pid, "folder": str(self.folder)}
            if self.proc.poll() is not None:
                return {"error": f"its server exited with status {self.proc.returncode}: {self._tail()}",
                        "retryable": False, "node": node}
            time.sleep(0.1)
        self.stop()
        return {"error": f"its server did not listen within {timeout_s:g} s: {self._tail()}",
                "retryable": True, "node": node}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's process group; SIGKILL what is left after the grace. Its folder
        (log, URL file) goes too."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(_CALL_TIMEOUT_S)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _tail(self) -> str:
        text = self.log.read_bytes()[-2000:].decode("utf-8", "replace").strip()
        return text or "(it printed nothing)"


@functools.cache
def _actor_class(ray: Any) -> Any:
    """``ReplicaServer`` as a Ray actor class, made once (Ray imported only when used)."""
    return ray.remote(ReplicaServer)
