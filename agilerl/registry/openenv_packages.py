"""Installed OpenEnv env packages, found the way openenv's ``AutoEnv`` finds them, as env names.

A distribution named ``openenv-<name>`` (not ``openenv-core``) that installs the module ``<name>``
(dashes as underscores) is an OpenEnv env, with or without an ``openenv.yaml`` in it (``pip install
envs/echo_env`` installs ``openenv-echo-env`` without one). Its key is the yaml's ``name:``, else
the module's name, without ``_env`` (``echo_env`` -> ``echo``), as ``AutoEnv.from_env("echo")``
names it. Listing reads metadata (and the yaml) only: no env code is imported until it is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import importlib_metadata
import yaml
from packaging.utils import canonicalize_name

from agilerl.errors import MissingExtra, ModuleNotImportable, OpenEnvPackageError
from agilerl.registry.plugins import PluginInfo
from agilerl.registry.registry import NAME_PATTERN, Entry, Registry

__all__ = [
    "MANIFEST",
    "DEFAULT_APP",
    "OpenEnvPackage",
    "discover_openenv_packages",
    "add_openenv_packages",
]

MANIFEST = "openenv.yaml"
DEFAULT_APP = "server.app:app"
_ENVIRONMENT = ("openenv.core.env_server.interfaces", "Environment")
_ACTION = ("openenv.core.env_server.types", "Action")


@dataclass(frozen=True)
class OpenEnvPackage:
    """One installed OpenEnv env: where its ``openenv.yaml`` says the server app lives."""

    key: str
    distribution: str
    version: str
    module: str
    app: str
    description: str
    location: str
    """Its openenv.yaml, or its package folder when it has none."""

    @property
    def app_module(self) -> str:
        """The module holding the server app (``echo_env.server.app``)."""
        return f"{self.module}.{self.app.partition(':')[0]}"

    @property
    def registry_reference(self) -> str:
        """How listings show the target: the app module openenv.yaml names."""
        return f"{self.app_module} (OpenEnv package {self.distribution})"

    def environment_class(self) -> type:
        """The Environment subclass the app serves: the one its module imports or defines."""
        classes = [c for c in self._app_namespace() if _is_own(c, _ENVIRONMENT)]
        if len(classes) != 1:
            found = ", ".join(c.__name__ for c in classes) or "none"
            raise OpenEnvPackageError(
                f"OpenEnv env {self.key!r} ({self.distribution}): {self.app_module} should hold one "
                f"Environment subclass, found {found}; name the class as 'module:Class' instead."
            )
        return classes[0]

    def action_class(self) -> type | None:
        """The Action subclass the app module holds, when there is exactly one (create_app's ``action_cls``)."""
        classes = [c for c in self._app_namespace() if _is_own(c, _ACTION)]
        return classes[0] if len(classes) == 1 else None

    def _app_namespace(self) -> list[type]:
        if importlib.util.find_spec("openenv") is None:
            raise MissingExtra("openenv", f"OpenEnv env {self.key!r} ({self.distribution})", "openenv")

        def not_importable(exc: ModuleNotFoundError) -> ModuleNotImportable:
            return ModuleNotImportable(
                f"OpenEnv env {self.key!r}: importing {self.app_module} (from {self.location}) "
                f"failed: {exc}",
                module=self.app_module,
            )

        with MissingExtra.translate(f"OpenEnv env {self.key!r}", not_importable):
            module = importlib.import_module(self.app_module)
        seen: dict[int, type] = {}
        for value in vars(module).values():
            if inspect.isclass(value):
                seen.setdefault(id(value), value)
        return list(seen.values())


def _is_own(klass: type, base: tuple[str, str]) -> bool:
    """A subclass of openenv's ``base`` that openenv itself does not define."""
    mro = getattr(klass, "__mro__", ())
    return any((c.__module__, c.__name__) == base for c in mro) and not klass.__module__.startswith("openenv.")


def discover_openenv_packages() -> list[OpenEnvPackage]:
    """Every installed ``openenv-*`` distribution that installs its env module."""
    found: dict[str, OpenEnvPackage] = {}
    for dist in _openenv_distributions():
        name = dist.metadata["Name"] or ""
        if not name.lower().startswith("openenv-") or canonicalize_name(name) == "openenv-core":
            continue
        module = name[len("openenv-"):].replace("-", "_")
        folder = _module_folder(dist, module)
        if folder is None:
            continue
        package = _package(name, dist.version, module, folder)
        if package is not None:
            found.setdefault(package.key, package)
    return sorted(found.values(), key=lambda p: p.key)


def _openenv_distributions() -> list[Any]:
    """Installed distributions whose metadata folder starts with ``openenv``, first on sys.path
    first: listing folders is much cheaper than reading every distribution's metadata."""
    seen: set[str] = set()
    found = []
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:  # a zip, or a folder that went away
            continue
        for name in names:
            lower = name.lower()
            if not lower.startswith("openenv") or not lower.endswith((".dist-info", ".egg-info")):
                continue
            project = canonicalize_name(lower.partition("-")[0].removesuffix(".dist-info").removesuffix(".egg-info"))
            if project in seen or project == "openenv-core":
                continue
            seen.add(project)
            found.append(importlib_metadata.PathDistribution(Path(entry or ".") / name))
    return found


def add_openenv_packages(registry: Registry) -> Registry:
    """Register each installed OpenEnv package as an env, under a plugin record of its own."""
    for package in discover_openenv_packages():
        info = PluginInfo(
            name=package.distribution,
            distribution=package.distribution,
            version=package.version,
            module=package.module,
            hooks=[MANIFEST],
            provides={"env": [package.key]},
        )
        registry.plugins.append(info)
        registry.add(Entry("env", package.key, package, f"OpenEnv env: {package.description}", info))
    return registry


def _module_folder(dist: Any, module: str) -> Path | None:
    """Where the distribution's package ``module`` lives: from the install record, else from the
    import system (an editable install); finding a top-level module's spec does not run it."""
    for file in dist.files or ():
        if file.parts[:1] == (module,) and len(file.parts) == 2 and file.name in (MANIFEST, "__init__.py"):
            path = Path(str(dist.locate_file(file))).parent
            if path.is_dir():
                return path
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location).is_dir():
            return Path(location)
    return None


def _package(distribution: str, version: str, module: str, folder: Path) -> OpenEnvPackage | None:
    path = folder / MANIFEST
    manifest: Any = {}
    if path.is_file():
        try:
            manifest = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            return None
    if not isinstance(manifest, dict):
        return None
    env_name = str(manifest.get("name") or module)
    key = (env_name[: -len("_env")] if env_name.endswith("_env") else env_name).lower()
    if not NAME_PATTERN.match(key):
        return None
    return OpenEnvPackage(
        key=key,
        distribution=distribution,
        version=version,
        module=module,
        app=str(manifest.get("app") or DEFAULT_APP),
        description=str(manifest.get("description") or f"{env_name} environment"),
        location=str(path if path.is_file() else folder),
    )
