"""A module's public surface against its ``__all__``: standard library only, so the same check runs
in any venv (tests/test_import_paths.py runs it here and, for modules built on vLLM, in ``.venv-vllm``).

    python tests/exports.py MODULE [MODULE ...]   # prints {module: problems} as JSON
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import TypeVar


def export_problems(module: str) -> list[str]:
    """What is wrong with ``module.__all__``: empty when it names exactly the module's public
    definitions (a package that only groups modules and defines nothing has none)."""
    imported = importlib.import_module(module)
    defined = [
        name
        for name, value in vars(imported).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == module
        and not isinstance(value, TypeVar)  # a type parameter is no export
    ]
    exported = getattr(imported, "__all__", None)
    if exported is None:
        return [f"{module} defines {defined} but has no __all__"] if defined else []
    problems = [f"{module}.__all__ repeats a name"] if len(set(exported)) != len(exported) else []
    problems += [f"{module}.__all__ names {name}, which does not exist" for name in exported if not hasattr(imported, name)]
    problems += [f"{module}: {name} is public but not in __all__" for name in defined if name not in exported]
    return problems


if __name__ == "__main__":
    print(json.dumps({module: export_problems(module) for module in sys.argv[1:]}))
