"""Name resolution for every manifest field that names something.

The plugin registry (pluggy hooks, entry points) is built on top of this in the plugins work;
``resolve`` is the one entry point the rest of the package calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from agilerl.registry.loading import LoadError, ModuleNotImportable, is_reference, load_object

Kind = Literal["env", "processor", "rubric", "algorithm"]

__all__ = ["Kind", "LoadError", "ModuleNotImportable", "load_object", "resolve"]


def resolve(kind: Kind, ref: str, *, base_dir: str | Path | None = None) -> Any:
    """Resolve a registered name, ``module:attr`` or ``file.py:attr`` to the object it names."""
    if is_reference(ref):
        return load_object(ref, base_dir)
    raise LoadError(f"no {kind} named {ref!r} is registered.")
