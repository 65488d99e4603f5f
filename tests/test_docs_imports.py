"""The docs import only from the public surface, and everything that surface lists imports.

Every ``from agilerl... import X`` and ``import agilerl...`` in README.md, CONTRIBUTING.md and
docs/*.md (Python blocks, shell blocks and inline code alike) must name a public module, and X
must be in that module's ``__all__`` and import from it.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.test_import_paths import PUBLIC

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_FROM_IMPORT = re.compile(r"\bfrom\s+(agilerl[\w.]*)\s+import\s+(\([^)]*\)|[\w ,]+)")
_IMPORT = re.compile(r"(?<![\w.])import\s+(agilerl[\w.]*)")


def _from_text(text: str) -> set[tuple[str, str | None]]:
    """Imports found by pattern: shell blocks, inline code, and Python that does not parse."""
    found: set[tuple[str, str | None]] = set()
    for module, names in _FROM_IMPORT.findall(text):
        for name in names.strip("()").replace("\n", " ").split(","):
            if name.split():
                found.add((module, name.split()[0]))
    found.update((module, None) for module in _IMPORT.findall(text))
    return found


def _from_python(code: str) -> set[tuple[str, str | None]]:
    """Imports of one Python block, read with ``ast`` (by pattern when the block is a sketch)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return _from_text(code)
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "agilerl":
            found.update((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names if a.name.split(".")[0] == "agilerl")
    return found


def doc_imports(path: Path) -> set[tuple[str, str | None]]:
    """``(module, name)`` for every agilerl import the document shows; name None for ``import m``."""
    text = path.read_text()
    found: set[tuple[str, str | None]] = set()
    for block in _PYTHON_BLOCK.findall(text):
        found |= _from_python(block)
    found |= _from_text(_PYTHON_BLOCK.sub("", text))
    return found


IMPORTS = sorted(
    ((path.relative_to(ROOT).as_posix(), module, name) for path in DOCS for module, name in doc_imports(path)),
    key=lambda item: (item[0], item[1], item[2] or ""),
)


def test_the_docs_show_imports():
    files = {doc for doc, _, _ in IMPORTS}
    assert {"README.md", "docs/collector.md", "docs/training.md", "docs/algorithms.md"} <= files


@pytest.mark.parametrize(("doc", "module", "name"), IMPORTS)
def test_doc_imports_from_the_public_surface(doc, module, name):
    assert module in PUBLIC, f"{doc} imports from {module}, which is not a public module: use one of {PUBLIC}"
    imported = importlib.import_module(module)
    if name is not None:
        assert name in imported.__all__, f"{doc}: {name} is not in {module}.__all__"
        assert getattr(imported, name) is not None


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_resolves(module):
    imported = importlib.import_module(module)
    assert imported.__all__, f"{module} exports nothing"
    assert len(set(imported.__all__)) == len(imported.__all__), f"{module}.__all__ repeats a name"
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name
        assert name in dir(imported), name


@pytest.mark.parametrize("module", PUBLIC[2:] + ("agilerl",))
def test_narrower_paths_agree_with_llm_envs(module):
    """Each name means one object, whichever public path it is imported from."""
    surface = importlib.import_module("agilerl.llm_envs")
    imported = importlib.import_module(module)
    for name in imported.__all__:
        if name == "__version__":
            continue
        assert name in surface.__all__, f"{module}.{name} is missing from agilerl.llm_envs"
        assert getattr(imported, name) is getattr(surface, name), name


def test_the_error_base_is_top_level_and_roots_every_exported_error():
    import agilerl
    import agilerl.llm_envs as surface

    errors = [getattr(surface, n) for n in surface.__all__ if n.endswith(("Error", "Timeout", "Extra"))]
    assert errors and all(issubclass(e, agilerl.AgileRLError) for e in errors)
