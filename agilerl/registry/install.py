"""Install a manifest's ``env_packages`` with uv, next to the trainer and never over it.

Every installed distribution is pinned as a constraint, so uv either adds what is missing or
fails: an env's requirements can never half-upgrade torch, transformers or agilerl itself.
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

# pip option -> (uv flag, uv env vars that already set it). uv ignores pip's configuration, so
# the indexes and wheel folders pip is configured with are passed on, unless UV_* overrides them.
_PIP_INDEX_OPTIONS = {
    "index-url": ("--index-url", ("UV_INDEX_URL", "UV_DEFAULT_INDEX")),
    "extra-index-url": ("--extra-index-url", ("UV_EXTRA_INDEX_URL", "UV_INDEX")),
    "find-links": ("--find-links", ("UV_FIND_LINKS",)),
}
_TRUE = ("1", "true", "yes", "on")


def install_packages(requirements: Sequence[str]) -> None:
    """Install requirement names with ``uv pip install`` into this interpreter, or raise."""
    checked = [_checked_requirement(req) for req in requirements]
    if not checked:
        return
    with tempfile.TemporaryDirectory(prefix="agilerl-uv-") as tmp:
        constraints = Path(tmp) / "installed.txt"
        constraints.write_text("\n".join(installed_constraints()) + "\n")
        command = [
            uv_binary(),
            "pip",
            "install",
            "--python",
            sys.executable,
            "--constraints",
            str(constraints),
            *pip_index_options(),
            "--",
            *checked,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise EnvPackagesError(
            f"env_packages {checked} cannot be installed alongside the trainer (every installed "
            "distribution is pinned to its current version, so the trainer's own packages are "
            f"never changed).\nuv said:\n{detail}\n"
            "Host the env in its own environment instead: serve it there with "
            "agilerl.llm_envs.openenv_server.resolve_env and set `env_url:` in the manifest."
        )


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
    no_index = config.get("no-index", [])
    if no_index and no_index[-1].lower() in _TRUE and "UV_NO_INDEX" not in os.environ:
        options.append("--no-index")
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
    from packaging.requirements import InvalidRequirement, Requirement

    text = requirement.strip()
    if not text or text.startswith("-"):
        raise EnvPackagesError(
            f"env_packages: {requirement!r} is not a package name; options such as '-e' or "
            "'--index-url' are not allowed, list requirement names only."
        )
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise EnvPackagesError(f"env_packages: {requirement!r} is not a valid requirement: {exc}.") from None
    return text
