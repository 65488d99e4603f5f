"""Import ``module:attr`` and ``path/to/file.py:attr`` references, with errors that say the fix."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from functools import partial
from pathlib import Path
from typing import Any

from agilerl.errors import LoadError, MissingExtra, ModuleNotImportable, is_missing_itself

__all__ = ["is_reference", "split_reference", "load_object", "file_without_attr_message"]

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
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            module = _load_file(target, base_dir)
        else:
            module = _import_module(target, ref, base_dir)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:  # SystemExit at import must not end the command without a word
        raise LoadError(
            f"importing {ref!r} raised {type(exc).__name__}({exc}); code that runs at import must "
            "not exit: move it under `if __name__ == '__main__':`."
        ) from None
    return _get_attr(module, attr, ref)


def _import_module(name: str, ref: str, base_dir: str | Path | None = None) -> Any:
    """Import ``name``; a top-level module that is not installed is looked for in the manifest's
    folder and the current folder, as ``python -m`` finds it (the console script's path has neither),
    and a package found there is importable from its own folder too (OpenEnv's layout)."""
    top = name.partition(".")[0]
    if _not_installed(top):
        for folder in (Path(base_dir) if base_dir is not None else None, Path.cwd()):
            if folder is not None and ((folder / top).is_dir() or (folder / f"{top}.py").is_file()):
                _on_path(folder)
                if (folder / top).is_dir():  # its modules' `from models import X`, as for a file
                    _on_path(folder / top)
    try:
        with MissingExtra.translate(repr(ref), partial(_missing_module_error, name, ref), importing=name):
            return importlib.import_module(name)
    except SyntaxError as exc:
        raise _syntax_error(exc, ref) from None


def _missing_module_error(name: str, ref: str, exc: ModuleNotFoundError) -> LoadError:
    """``name`` itself not installed (``env_packages`` can install it), or a module it imports."""
    missing = exc.name or name
    if is_missing_itself(name, missing):
        return ModuleNotImportable(
            f"cannot import module {name!r} (from {ref!r}): it is not installed. "
            "Install the package that provides it, or list it under `env_packages` "
            "in the manifest so it is installed on first use.",
            module=name,
        )
    return LoadError(
        f"importing {name!r} (from {ref!r}) failed: it needs {missing!r}, which is not installed."
    )


def _load_file(target: str, base_dir: str | Path | None) -> Any:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise LoadError(f"file not found: {path} (from {target!r}, relative to {base_dir or Path.cwd()}).")
    package = _package_module(path)
    if package is not None:
        return _import_from_package(path, *package)
    _on_path(path.parent)  # its sibling modules import as `python file.py` finds them
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
    except SyntaxError as exc:
        del sys.modules[mod_name]
        raise _syntax_error(exc, target) from None
    except ImportError:  # a missing package: its own message (an extra to install) is made above
        del sys.modules[mod_name]
        raise
    except Exception as exc:  # the user's file raised while it ran: theirs to fix, as a syntax error is
        del sys.modules[mod_name]
        raise LoadError(f"{target!r}: running {path} raised {type(exc).__name__}: {exc}; fix the file.") from exc
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def _syntax_error(exc: SyntaxError, ref: str) -> LoadError:
    """A user's file that does not parse is theirs to fix: where, and what Python said."""
    where = f"{exc.filename}, line {exc.lineno}" if exc.lineno else str(exc.filename or ref)
    line = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
    return LoadError(f"{ref!r} is not valid Python ({where}: {exc.msg}{line}); fix the file.")


def _package_module(path: Path) -> tuple[Path, str] | None:
    """For a file inside a package (its folder has ``__init__.py``): the folder above the
    outermost package, and the file's dotted module name there; None for a loose file."""
    if not (path.parent / "__init__.py").is_file():
        return None
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return folder, ".".join(parts)


def _import_from_package(path: Path, root: Path, name: str) -> Any:
    """Import a package's file as part of its package, so ``from ..models import X`` works; the
    outermost package's folder goes on the path too, so ``from models import X`` (OpenEnv's
    layout when run from the env's folder) works as well."""
    _on_path(root, first=True)
    _on_path(root / name.partition(".")[0])
    try:
        module = importlib.import_module(name)
    except SyntaxError as exc:
        raise _syntax_error(exc, str(path)) from None
    found = Path(getattr(module, "__file__", "") or "").resolve()
    if found != path:
        raise LoadError(
            f"{path} is module {name!r} of its package, but {name!r} is already imported from "
            f"{found}; name the installed one as 'module:attr' ({name}:...), or rename the package."
        )
    return module


def _not_installed(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):
        return True


def _on_path(folder: Path, *, first: bool = False) -> None:
    """Put ``folder`` on ``sys.path`` once: first, to win over an installed namesake, else last."""
    entry = str(folder.resolve())
    if entry in sys.path:
        return
    if first:
        sys.path.insert(0, entry)
    else:
        sys.path.append(entry)
    importlib.invalidate_caches()


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
