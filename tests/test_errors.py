"""One error tree: every error agilerl raises on purpose is an AgileRLError, and a bad argument is
a ValueError too, so callers can catch either."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

import agilerl.errors as errors
from agilerl.errors import (
    AgileRLError,
    AgileRLWarning,
    InvalidArgument,
    LoadError,
    MissingExtra,
    PlotUnavailable,
)
from agilerl.llm_envs import RolloutHarness, TaskAssigner
from agilerl.generation.policy import SamplingParams

PACKAGE = Path(errors.__file__).parent


def test_every_error_class_lives_in_errors_py_under_agilerl_error():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 20
    warning_classes = [c for c in classes if issubclass(c, Warning)]
    assert warning_classes and all(issubclass(c, AgileRLWarning) for c in warning_classes)
    assert all(issubclass(c, AgileRLError) for c in classes if c not in warning_classes)
    defined_elsewhere = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "errors.py"
        for name in re.findall(r"^class (\w+)\((?:[\w.]*Error|Exception)\b", path.read_text(), re.M)
    ]
    # Exceptions that never leave their package may stay there: FrameError becomes an error frame
    # inside the server, ConnectionLost a retry or an EnvUnavailable inside the client. Everything
    # a user can catch belongs in errors.py.
    internal = {"remote/frames.py: FrameError", "remote/connection.py: ConnectionLost"}
    assert [d for d in defined_elsewhere if not d.split(": ")[1].startswith("_") and d not in internal] == []


def test_the_tree_in_the_docstring_names_every_class():
    classes = {c.__name__ for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__}
    assert classes <= set(re.findall(r"\w+", errors.__doc__ or ""))


class _Env:
    def reset(self, seed=None):
        return "prompt", {}

    def step(self, action):
        return "obs", 0.0, True, False, {}


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda tok: RolloutHarness.local(_Env(), tok, max_turns=0),
        lambda tok: SamplingParams(temperature=-1),
        lambda tok: SamplingParams(top_p=0),
        lambda tok: TaskAssigner(10, seed=0, rank=3, world_size=2),
        lambda tok: TaskAssigner(10, rank=0, world_size=2),
    ],
    ids=["max_turns=0", "temperature<0", "top_p=0", "rank>=world_size", "no seed across ranks"],
)
def test_a_bad_argument_is_both_a_value_error_and_an_agilerl_error(bad_call, chatml_tokenizer):
    with pytest.raises(InvalidArgument) as info:
        bad_call(chatml_tokenizer)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AgileRLError)


def test_manifest_error_is_raised_only_where_manifests_are_read():
    raisers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "raise ManifestError(" in path.read_text()
    )
    assert raisers == ["assembly/from_manifest.py", "cli/manifest_cmd.py", "manifest/spec.py"]


def test_no_error_is_raised_as_the_bare_root():
    """Each raise picks the branch that says what went wrong, so callers can catch a family."""
    bare = sorted(
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\braise AgileRLError\(", line)
    )
    assert bare == []


def test_every_warning_the_package_gives_is_one_of_its_own():
    """A user filters all of ours with ``-W error::agilerl.errors.AgileRLWarning``: each
    ``warnings.warn`` names a category of the tree (or warns with an instance of one)."""
    ours = {name for name, value in vars(errors).items() if inspect.isclass(value) and issubclass(value, errors.AgileRLWarning)}
    untyped = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "warnings.warn"):
                continue
            category = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "category"), None)
            named = category if category is not None else node.args[0]
            if isinstance(named, ast.Call):
                named = named.func
            if not (isinstance(named, ast.Name) and named.id in ours):
                untyped.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert untyped == []


def test_tests_import_every_error_from_agilerl_errors():
    """Modules that raise an error import it; only ``agilerl.errors`` (and the documented
    ``agilerl.llm_envs`` facade) is where callers get it from."""
    error_names = {name for name, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__}
    elsewhere = [
        f"{path.name}:{node.lineno} {node.module}.{alias.name}"
        for path in sorted(Path(__file__).parent.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agilerl")
        and node.module not in ("agilerl.errors", "agilerl.llm_envs")
        for alias in node.names
        if alias.name in error_names
    ]
    assert elsewhere == []


def test_a_missing_matplotlib_is_a_warning_and_the_run_keeps_its_numbers(tmp_path, monkeypatch):
    from agilerl.train.metrics import plot_curves

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "train/reward": 0.5}\n')
    with pytest.warns(PlotUnavailable, match=r"no curve.png: plotting needs matplotlib .*agilerl-envlayer\[plot\]"):
        assert plot_curves(metrics, tmp_path / "curve.png", ("train/reward", "eval/reward"), title="t") is None
    assert issubclass(PlotUnavailable, UserWarning) and not issubclass(PlotUnavailable, AgileRLError)


def test_one_translation_turns_a_missing_extra_module_into_the_line_to_install_it():
    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    with pytest.raises(MissingExtra, match=r"^agilerl x needs the 'train' extra \(torch.nn is not installed\): pip install 'agilerl-envlayer\[train\]'$"):
        with MissingExtra.translate("agilerl x"):
            missing("torch.nn")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):  # not ours: unchanged
        with MissingExtra.translate("agilerl x"):
            missing("no_such_module")
    with pytest.raises(LoadError, match="needs no_such_module") as info:
        with MissingExtra.translate("agilerl x", lambda exc: LoadError(f"needs {exc.name}")):
            missing("no_such_module")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    with pytest.raises(LoadError, match="needs torch"):  # the module a reference names is not an extra's
        with MissingExtra.translate("x", lambda exc: LoadError(f"needs {exc.name}"), importing="torch.nn"):
            missing("torch")
