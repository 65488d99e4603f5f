"""An env in a uv venv of its own: built once per set of resolved requirements, cached, served.

``prepare_env`` gives the python that serves a ``ReplicaSpec``'s env: the trainer's own
(``isolation: none``), or a venv holding the env's ``env_packages`` next to the agilerl-envlayer
the trainer runs, from wherever the trainer's came from (an editable checkout, a wheel, an
index). A venv lives in ``$AGILERL_CACHE_DIR/envs/<hash>`` (default ``~/.cache/agilerl``), named by
the hash of its resolved requirements; what a manifest asks for is mapped to that hash once, so
a second start neither resolves nor touches the network. ``serve_argv`` is the command that
serves the env from that python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agilerl.errors import EnvPackagesError, InvalidArgument
from agilerl.fleet.provider import ReplicaSpec

__all__ = [
    "EnvRuntime",
    "PreparedEnv",
    "agilerl_requirement",
    "cache_root",
    "env_requirements",
    "prepare_env",
    "prepared_envs",
    "remove_prepared",
    "serve_argv",
    "serve_environ",
]

MARKER = "agilerl-env.json"
"""Written last into a venv: a folder without it is a build that did not finish."""
_HIDDEN_FROM_VENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
"""The trainer's interpreter settings a venv's python must not inherit: they would put the
trainer's packages back in front of the env's own."""
ADAPTER_OPTIONS = ("action_field", "observation_field", "observation_processor", "image_field", "mcp_tool", "action_type")
"""An entrypoint's OpenEnv adapter options: they go to the server, which drives the env in process."""


@dataclass(frozen=True)
class EnvRuntime:
    """The interpreter that serves an env: the trainer's, or a prepared venv's."""

    python: str
    venv: str | None = None
    requirements_hash: str | None = None

    def describe(self) -> str:
        return f"venv {self.venv}" if self.venv else "the trainer's interpreter"


@dataclass(frozen=True)
class PreparedEnv:
    """A prepared venv in the cache (``agilerl env prepared``)."""

    hash: str
    path: Path
    size_bytes: int
    requirements: list[str]
    created: float


def cache_root() -> Path:
    """Where prepared venvs live: ``$AGILERL_CACHE_DIR/envs``, else ``~/.cache/agilerl/envs``."""
    base = os.environ.get("AGILERL_CACHE_DIR") or str(Path.home() / ".cache" / "agilerl")
    return Path(base).expanduser() / "envs"


def env_requirements(environment: dict[str, Any]) -> list[str]:
    """The ``env_packages`` of an ``environment:`` section (as JSON), checked as requirements."""
    from agilerl.manifest.requirements import check_requirement

    packages = environment.get("env_packages") or {}
    listed = packages.get("uv") if packages.get("uv") is not None else packages.get("pip") or []
    try:
        return [check_requirement(p) for p in listed]
    except ValueError as exc:
        raise EnvPackagesError(f"env_packages: {exc}") from None


def agilerl_requirement() -> str:
    """The agilerl-envlayer this process runs, as a requirement a venv installs: ``-e DIR`` for a
    checkout (the package's folder has its pyproject), the wheel or URL it was installed from
    (its ``direct_url.json``), else the same version from the index."""
    import agilerl

    package_dir = Path(agilerl.__file__).resolve().parent
    project = package_dir.parent / "pyproject.toml"
    if project.is_file() and "agilerl-envlayer" in project.read_text(errors="replace"):
        return f"-e {package_dir.parent}"
    import importlib_metadata

    for dist in importlib_metadata.distributions(name="agilerl-envlayer"):
        raw = dist.read_text("direct_url.json")
        if not raw:
            continue
        direct = json.loads(raw)
        url = direct.get("url", "")
        if (direct.get("dir_info") or {}).get("editable"):
            return f"-e {url.removeprefix('file://')}"
        vcs = direct.get("vcs_info")
        if vcs:
            return f"agilerl-envlayer @ {vcs['vcs']}+{url}@{vcs.get('commit_id', '')}".rstrip("@")
        if url.startswith("file://") and not Path(url.removeprefix("file://")).exists():
            continue  # the wheel it came from is gone: fall back to the index
        return f"agilerl-envlayer @ {url}"
    return f"agilerl-envlayer=={agilerl.__version__}"


def prepare_env(spec: ReplicaSpec, *, offline: bool = False) -> EnvRuntime:
    """The python that serves ``spec``'s env, its venv built (or found) first with ``isolation: venv``.

    The first build resolves with uv (pip's index settings, ``pip_index_options``) and installs;
    later calls find the venv from what the manifest asks for, with no resolve and no network.
    ``offline`` builds from uv's cache only. Safe to call from several processes at once.
    """
    environment = spec.environment
    if environment.get("isolation", "none") == "none":
        return EnvRuntime(sys.executable)
    requested = [agilerl_requirement(), *env_requirements(environment)]
    root = cache_root()
    key = _digest({"python": _python_tag(), "requirements": requested})
    pointer = root / "requests" / key
    with _locked(root, key):
        found = _read_pointer(pointer)
        if found is not None:
            return found
        lock_text = _resolve(requested, offline=offline)
        digest = _digest({"python": _python_tag(), "lock": _lock_lines(lock_text)})[:16]
        venv = root / digest
        with _locked(root, digest):
            if not (venv / MARKER).is_file():
                _build(venv, requested, lock_text, offline=offline)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(pointer, digest)
    return _runtime(venv)


def serve_argv(
    spec: ReplicaSpec,
    runtime: EnvRuntime,
    port: int = 0,
    *,
    port_file: str | None = None,
    parent_pid: int | None = None,
) -> list[str]:
    """``agilerl serve`` for ``spec``'s env from ``runtime``'s python, on 127.0.0.1:``port``
    (0: a free one). ``port_file`` receives the bound URL once it listens; the server exits by
    itself when ``parent_pid`` is gone (a trainer killed with SIGKILL leaves no replica behind)."""
    environment = spec.environment
    entrypoint = environment.get("entrypoint")
    if not entrypoint:
        raise InvalidArgument("a fleet serves an 'entrypoint' env; this environment names none")
    argv = [
        runtime.python, "-m", "agilerl", "serve", entrypoint,
        "--env-config", json.dumps(environment.get("env_config") or {}),
        "--base-dir", spec.base_dir,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-concurrent-envs", str(spec.max_concurrent_envs),
    ]
    for option in ADAPTER_OPTIONS:
        if environment.get(option) is not None:
            argv += [f"--{option.replace('_', '-')}", str(environment[option])]
    if runtime.venv is None:  # the trainer's interpreter: installed there when missing, as in process
        for package in env_requirements(environment):
            argv += ["--env-package", package]
    if port_file is not None:
        argv += ["--port-file", port_file]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    return argv


def serve_environ(runtime: EnvRuntime, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``serve_argv`` runs in: ``base`` (this process's), less what would let the
    trainer's packages into a venv, and unbuffered so a replica's log is current."""
    env = dict(os.environ if base is None else base, PYTHONUNBUFFERED="1")
    if runtime.venv is not None:
        for name in _HIDDEN_FROM_VENV:
            env.pop(name, None)
    return env


def prepared_envs() -> list[PreparedEnv]:
    """The complete venvs in the cache, newest first."""
    root = cache_root()
    found: list[PreparedEnv] = []
    for marker in root.glob(f"*/{MARKER}"):
        try:
            record = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        found.append(PreparedEnv(
            marker.parent.name, marker.parent, _size(marker.parent),
            list(record.get("requirements", [])), float(record.get("created", 0)),
        ))
    return sorted(found, key=lambda p: -p.created)


def remove_prepared(hashes: list[str] | None = None) -> list[str]:
    """Delete prepared venvs (all with ``None``), and the requests that pointed at them; the
    hashes removed. A hash that is not prepared is an error naming the ones that are."""
    root = cache_root()
    known = {p.hash: p for p in prepared_envs()}
    unfinished = [d for d in root.glob("*") if d.is_dir() and d.name not in ("requests", ".locks") and not (d / MARKER).exists()]
    if hashes is None:
        targets = list(known)
    else:
        missing = [h for h in hashes if h not in known]
        if missing:
            raise InvalidArgument(
                f"no prepared env {missing[0]!r}; prepared: {', '.join(known) or 'none'} (agilerl env prepared)"
            )
        targets, unfinished = list(hashes), []
    for digest in targets:
        with _locked(root, digest):
            shutil.rmtree(known[digest].path, ignore_errors=True)
    for folder in unfinished:
        shutil.rmtree(folder, ignore_errors=True)
    for pointer in (root / "requests").glob("*"):
        if _read_pointer(pointer) is None:
            pointer.unlink(missing_ok=True)
    return targets


# -- building ---------------------------------------------------------------------------------


def _resolve(requested: list[str], *, offline: bool) -> str:
    """``uv pip compile`` of the requirements for this interpreter: the lock text."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="agilerl-env-") as tmp:
        source = Path(tmp) / "requirements.in"
        source.write_text("\n".join(requested) + "\n")
        out = Path(tmp) / "requirements.txt"
        _uv(["pip", "compile", "--python", sys.executable, "--no-header", "--quiet",
             str(source), "-o", str(out)], requested, offline=offline, cwd=tmp)
        return out.read_text()


def _build(venv: Path, requested: list[str], lock_text: str, *, offline: bool) -> None:
    """A fresh venv at ``venv`` with exactly the locked requirements; its marker written last."""
    shutil.rmtree(venv, ignore_errors=True)  # a build that died half-way
    started = time.monotonic()
    print(f"isolation: building a venv for {', '.join(requested[1:]) or 'the env'} in {venv}", file=sys.stderr, flush=True)
    venv.mkdir(parents=True)
    _uv(["venv", "--quiet", "--python", sys.executable, str(venv)], requested, offline=offline, cwd=str(venv))
    lock = venv / "agilerl-requirements.txt"
    lock.write_text(lock_text)
    _uv(["pip", "install", "--python", str(_python_of(venv)), "-r", str(lock)], requested, offline=offline, cwd=str(venv))
    record = {
        "requirements": requested, "lock": _lock_lines(lock_text), "python": _python_tag(),
        "created": time.time(), "build_s": round(time.monotonic() - started, 2),
    }
    _write_atomic(venv / MARKER, json.dumps(record, indent=2))
    print(f"isolation: venv ready in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def _uv(arguments: list[str], requested: list[str], *, offline: bool, cwd: str) -> None:
    """Run uv with pip's index settings and constraint files (uv reads none of pip's
    configuration); its output shown when it fails, in an ``EnvPackagesError`` that says what
    to check."""
    from agilerl.registry.install import pip_constraint_options, pip_index_options, uv_binary

    index = [] if arguments[0] == "venv" else [*pip_index_options(), *pip_constraint_options()]
    command = [uv_binary(), *arguments[:2], *index, *(["--offline"] if offline else []), *arguments[2:]]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, timeout=1800)
    if result.returncode == 0:
        return
    detail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
    hint = (
        "offline: only what uv has cached can be installed; prepare the env with network first "
        "(agilerl env prepare MANIFEST)"
        if offline
        else "check the names and versions, and that pip's index settings (pip config list) or UV_* "
        "variables reach an index that has them"
    )
    raise EnvPackagesError(
        f"isolation: venv: could not {'resolve' if 'compile' in arguments else 'install'} "
        f"{', '.join(requested)}.\nuv said:\n{detail}\n{hint}."
    )


# -- the cache --------------------------------------------------------------------------------


def _runtime(venv: Path) -> EnvRuntime:
    return EnvRuntime(str(_python_of(venv)), str(venv), venv.name)


def _read_pointer(pointer: Path) -> EnvRuntime | None:
    """The venv a request was resolved to, when it is still there and complete."""
    try:
        digest = pointer.read_text().strip()
    except OSError:
        return None
    venv = pointer.parent.parent / digest
    return _runtime(venv) if digest and (venv / MARKER).is_file() else None


def _python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _python_tag() -> str:
    return f"{platform.python_implementation()}-{platform.python_version()}-{sys.platform}-{platform.machine()}"


def _lock_lines(lock_text: str) -> list[str]:
    return sorted(
        line.strip() for line in lock_text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """One process at a time builds (or removes) a given venv; the others wait, then find it."""
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; builds there are not concurrent-safe
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
