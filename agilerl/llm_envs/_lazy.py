"""The lazy re-export the public modules share: a name -> defining-module map, imported on first use."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agilerl.registry.registry import Kind


def lazy_exports(
    module: str,
    names: Mapping[str, str],
    registered: Mapping[str, tuple[Kind, str]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` serving ``names``, so importing it stays cheap.

    ``registered`` names (name -> kind, registered name) come from the registry: that is how a
    facade re-exports the built-ins, a plugin the core never imports.
    """
    from_registry = dict(registered or {})

    def __getattr__(name: str) -> Any:
        if name in from_registry:
            from agilerl.registry.resolver import get_registry

            value = get_registry().load(*from_registry[name])
        elif name in names:
            value = getattr(import_module(names[name]), name)
        else:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        setattr(sys.modules[module], name, value)  # the next lookup skips __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module]), *names, *from_registry})

    return __getattr__, __dir__
