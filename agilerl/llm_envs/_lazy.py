"""The lazy re-export the public modules share: a name -> defining-module map, imported on first use."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(module: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` serving ``names``, so importing it stays cheap."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(import_module(names[name]), name)
        setattr(sys.modules[module], name, value)  # the next lookup skips __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module]), *names})

    return __getattr__, __dir__
