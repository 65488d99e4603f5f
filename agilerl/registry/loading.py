"""Import ``module:attr`` and ``path/to/file.py:attr`` references, with errors that say the fix."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from agilerl.errors import LoadError, MissingExtra, ModuleNotImportable

_FILE_MODULE_PREFIX = "_agilerl_file_"


def is_reference(ref: str) -> bool:
    """A ``:`` always means ``module:attr`` or ``file.py:attr``; registered names never hold one."""
    return ":" in ref


def split_reference(ref: str) -> tuple[str, str]:
    """Split ``target:attr`` at the last colon (Windows drive letters stay in the target)."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise LoadError(
            f"{ref!r} is not a reference: write 'module:attr' or 'path/to/file.py:attr'."
        )
    return target, attr


def load_object(ref: str, base_dir: str | Path | None = None) -> Any:
    """Import what ``ref`` names; file paths are relative to ``base_dir`` (the manifest's folder)."""
    target, attr = split_reference(ref)
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(target, base_dir)
    else:
        module = _import_module(target, ref)
    return _get_attr(module, attr, ref)


def _import_module(name: str, ref: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or name
        if missing == name or name.startswith(missing + "."):
            raise ModuleNotImportable(
                f"cannot import module {name!r} (from {ref!r}): it is not installed. "
                "Install the package that provides it, or list it under `env_packages` "
                "in the manifest so it is installed on first use.",
                module=name,
            ) from exc
        extra = MissingExtra.for_module(missing, f"{ref!r}")
        if extra is not None:
            raise extra from None
        raise LoadError(
            f"importing {name!r} (from {ref!r}) failed: it needs {missing!r}, which is not "
            "installed."
        ) from exc


def _load_file(target: str, base_dir: str | Path | None) -> Any:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise LoadError(f"file not found: {path} (from {target!r}, relative to {base_dir or Path.cwd()}).")
    # One module per file path, so loading a file twice gives the same classes.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    mod_name = f"{_FILE_MODULE_PREFIX}{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot load {path} as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def _get_attr(module: Any, attr: str, ref: str) -> Any:
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            # a file's module has a made-up name; the user knows it by its path
            where = module.__file__ if module.__name__.startswith(_FILE_MODULE_PREFIX) else module.__name__
            raise LoadError(
                f"{ref!r}: {where!r} has no attribute {attr!r}. "
                f"It has: {', '.join(public) or '(nothing public)'}."
            ) from None
    return obj


def file_without_attr_message(ref: str, base_dir: str | Path | None) -> str:
    """What to write instead of a bare ``file.py``: the ``file.py:Class`` form, with its classes."""
    path = Path(base_dir or Path.cwd()) / ref
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        classes: list[str] = []
    else:
        classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
    example = f"{ref}:{classes[0] if classes else 'ClassName'}"
    found = f" ({path} defines: {', '.join(classes)})" if classes else ""
    return f"{ref!r} is a file; name the env in it as {example!r}{found}."
