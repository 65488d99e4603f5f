"""Lazy imports obey the layer contracts too: import-linter cannot see a ``"module"`` or
``"module:attr"`` string that is imported on first use (the facades' tables, the built-ins'
registrations), so this test reads every such string as the import it becomes and checks it
against the contracts in pyproject.toml."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agilerl"
_MODULE_STRING = re.compile(r"agilerl(?:\.\w+)+(?::\w+)?")
_CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lazy_imports() -> list[tuple[str, str]]:
    """(importer, imported module) for every string constant naming an agilerl module."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value):
                found.append((_module_name(path), node.value.split(":")[0]))
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer(module: str, layers: list[list[str]]) -> int | None:
    """The index (0 = top) of the layer holding ``module``; None outside every layer."""
    return next((i for i, layer in enumerate(layers) if any(_within(module, f"agilerl.{m}") for m in layer)), None)


def _problems(importer: str, imported: str) -> list[str]:
    problems = []
    for contract in _CONTRACTS:
        if contract["type"] == "layers":
            layers = [re.split(r"\s*[|:]\s*", layer) for layer in contract["layers"]]
            mine, theirs = _layer(importer, layers), _layer(imported, layers)
            if mine is None or theirs is None:
                continue
            siblings = theirs == mine and importer.split(".")[:2] != imported.split(".")[:2]
            independent = "|" in contract["layers"][mine]  # 'a | b' may not import each other; 'a : b' may
            if theirs < mine or (siblings and independent):
                problems.append(f"{importer} -> {imported} breaks {contract['name']!r}")
        elif contract["type"] == "forbidden":
            sources, forbidden = contract["source_modules"], contract["forbidden_modules"]
            if any(_within(importer, s) for s in sources) and any(_within(imported, f) for f in forbidden):
                problems.append(f"{importer} -> {imported} breaks {contract['name']!r}")
    return problems


def test_the_scan_finds_the_facades_and_the_registrations():
    importers = {importer for importer, _ in _lazy_imports()}
    assert {"agilerl", "agilerl.llm_envs", "agilerl.llm_envs.openenv", "agilerl.builtins.registrations"} <= importers


def test_no_lazy_import_reaches_where_the_contracts_forbid():
    assert [p for importer, imported in _lazy_imports() for p in _problems(importer, imported)] == []


def test_a_string_into_the_built_ins_from_the_facade_would_be_caught():
    assert _problems("agilerl.llm_envs", "agilerl.builtins.rubrics")
    assert _problems("agilerl.rollout.harness", "agilerl.manifest.spec")
    assert _problems("agilerl.data.tables", "agilerl.rollout.harness")
    assert _problems("agilerl.llm_envs", "agilerl.cli.main")  # independent siblings
    assert not _problems("agilerl.builtins.registrations", "agilerl.data.rubric")


def test_the_facade_hands_out_the_registered_built_in_rubrics():
    import agilerl.llm_envs as facade
    from agilerl.registry.resolver import get_registry

    for name in ("exact_match", "numeric_match", "boxed_match", "think_answer_format", "countdown"):
        assert name in facade.__all__ and name in dir(facade)
        assert getattr(facade, name) is get_registry().load("rubric", name)
    assert facade.exact_match("<answer>Paris</answer>", "paris") == 1.0
