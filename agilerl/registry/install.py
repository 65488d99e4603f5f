"""Install a manifest's ``env_packages`` with uv, next to the trainer and never over it.

Every installed distribution is pinned as a constraint, so uv either adds what is missing or
fails: an env's requirements can never half-upgrade torch, transformers or agilerl itself.
uv reads pip's index settings the way pip does (``pip_index_options``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import importlib_metadata

from agilerl.errors import EnvPackagesError
from agilerl.manifest.requirements import check_requirement

__all__ = ["install_packages", "installed_constraints", "uv_binary", "pip_index_options", "pip_constraint_options"]

# pip option -> (uv flag, uv env vars that already set it). uv ignores pip's configuration, so
# the indexes and wheel folders pip is configured with are passed on, unless UV_* overrides them.
_PIP_INDEX_OPTIONS = {
    "index-url": ("--index-url", ("UV_INDEX_URL", "UV_DEFAULT_INDEX")),
    "extra-index-url": ("--extra-index-url", ("UV_EXTRA_INDEX_URL", "UV_INDEX")),
    "find-links": ("--find-links", ("UV_FIND_LINKS",)),
}
_TRUE = ("1", "true", "yes", "on")


def install_packages(requirements: Sequence[str]) -> None:
    """Install requirement names with ``uv pip install`` into this interpreter, or raise.

    uv's progress goes to stderr as it runs; it runs in an empty folder, so nothing in the
    working directory can be mistaken for a package.
    """
    checked = [_checked_requirement(req) for req in requirements]
    if not checked:
        return
    print(f"env_packages: installing {', '.join(checked)} with uv", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="agilerl-uv-") as tmp:
        constraints = Path(tmp) / "installed.txt"
        constraints.write_text("\n".join(installed_constraints()) + "\n")
        pinned = ["--constraints", str(constraints)]
        returncode, output = _run_uv([*pinned, "--", *checked], cwd=tmp, echo=True)
        if returncode == 0:
            return
        # Would it resolve if the installed versions were free to move? That tells a clash with
        # the trainer's packages from packages the indexes simply cannot provide.
        free, _ = _run_uv(["--dry-run", "--", *checked], cwd=tmp, echo=False)
    detail = "\n".join(output.strip().splitlines()[-15:])
    if free == 0:
        raise EnvPackagesError(
            f"env_packages {checked} need versions of packages the trainer already has installed "
            "(installed versions are held fixed, so the trainer is never changed under it).\n"
            f"uv said:\n{detail}\nGive the env an environment of its own: set `isolation: venv` "
            "in the manifest's environment section (its packages go into a cached uv venv, served for "
            "the run; docs/env-fleets.md), or serve it yourself with `agilerl serve` and set `env_url:`."
        )
    raise EnvPackagesError(
        f"env_packages {checked} cannot be resolved from the configured package indexes.\n"
        f"uv said:\n{detail}\nCheck the names and versions, and that pip's index settings "
        "(pip config list) or UV_* variables reach an index that has them."
    )


def _run_uv(arguments: list[str], *, cwd: str, echo: bool) -> tuple[int, str]:
    """``uv pip install`` into this interpreter with pip's indexes; (exit code, its output)."""
    command = [uv_binary(), "pip", "install", "--python", sys.executable, *pip_index_options(), *arguments]
    lines: list[str] = []
    with subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if echo:
                print(f"  uv: {line.rstrip()}", file=sys.stderr, flush=True)
    return process.returncode, "".join(lines)


def installed_constraints() -> list[str]:
    """``name==version`` for every installed distribution, the first found of each name."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    pins: dict[str, str] = {}
    for dist in importlib_metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if not name or not version:
            continue
        try:
            Version(version)
        except InvalidVersion:
            continue
        pins.setdefault(canonicalize_name(name), f"{name}=={version}")
    return sorted(pins.values())


def uv_binary() -> str:
    """The uv that ships with the ``uv`` package, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise EnvPackagesError(
        "env_packages needs uv to install packages: `pip install uv` (or put uv on PATH)."
    )


def pip_index_options() -> list[str]:
    """uv flags for the index options pip is configured with (``pip config list``, PIP_*)."""
    options: list[str] = []
    config = _pip_config()
    for pip_option, (flag, uv_vars) in _PIP_INDEX_OPTIONS.items():
        if any(os.environ.get(var) for var in uv_vars):
            continue
        for value in config.get(pip_option, []):
            options += [flag, value]
    if "--extra-index-url" in options and not os.environ.get("UV_INDEX_STRATEGY"):
        # pip merges its indexes and takes the best version anywhere; uv by default stops at the
        # first index that has a name at all (a PyTorch wheel index shadows PyPI's nltk, say).
        options += ["--index-strategy", "unsafe-best-match"]
    no_index = config.get("no-index", [])
    if no_index and no_index[-1].lower() in _TRUE and "UV_NO_INDEX" not in os.environ:
        options.append("--no-index")
    return options


def pip_constraint_options() -> list[str]:
    """uv flags for the constraint files pip is configured with (``constraint`` in pip's config,
    ``PIP_CONSTRAINT``): a fresh venv resolves within the same caps pip would (a torch release
    that lies on disk, say), unless ``UV_CONSTRAINT`` sets uv's own."""
    if os.environ.get("UV_CONSTRAINT"):
        return []
    options: list[str] = []
    for value in _pip_config().get("constraint", []):
        if Path(value).is_file() or "://" in value:
            options += ["--constraint", value]
    return options


def _pip_config() -> dict[str, list[str]]:
    """pip's effective settings as ``option -> values``; environment (PIP_*) values win."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    from_env: dict[str, list[str]] = {}
    from_files: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        scope, _, option = key.rpartition(".")
        target = from_env if scope == ":env:" else from_files
        values = target.setdefault(option, [])
        for value in raw.strip().strip("'\"").split():
            if value not in values:
                values.append(value)
    return {**from_files, **from_env}


def _checked_requirement(requirement: str) -> str:
    try:
        return check_requirement(requirement)
    except ValueError as exc:
        raise EnvPackagesError(f"env_packages: {exc}") from None
