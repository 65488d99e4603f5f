"""A fresh `agilerl train` never mixes with an earlier run in the same output_dir, and `--overwrite`
deletes only a folder that is recognisably a run (dangerous values only inside a scratch home)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agilerl.cli.main import main

SFT = Path(__file__).resolve().parents[1] / "examples" / "sft" / "manifest.yaml"


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train(out: Path, *extra: str) -> int:
    return main(["train", str(SFT), "--output-dir", str(out), "--no-progress", *extra])


def test_a_fresh_run_into_a_used_output_dir_is_refused_then_overwritten_or_resumed(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "--max-steps", "3") == 0
    first = sorted(p.name for p in (out / "checkpoints").iterdir())
    capsys.readouterr()

    assert _train(out, "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert f"output_dir {out} already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert _steps(out) == [0, 1, 2, 3]  # untouched

    assert _train(out, "--max-steps", "1", "--overwrite") == 0
    assert _steps(out) == [0, 1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"] != first

    assert _train(out, "--max-steps", "2", "--resume") == 0
    assert _steps(out) == [0, 1, 2]


def test_manifest_validate_prints_the_output_dir_train_uses(capsys):
    assert main(["manifest", "validate", str(SFT)]) == 0
    assert "output_dir: runs/sft" in capsys.readouterr().out


GUESS_MANIFEST = "environment:\n  env_type: rollout\n  entrypoint: guess\n"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch home holding a project (the manifest, a user's file) and a sub-folder to run from."""
    home = tmp_path / "home"
    project = home / "project"
    (project / "sub").mkdir(parents=True)
    (project / "m.yaml").write_text(GUESS_MANIFEST)
    (project / "notes.txt").write_text("mine")
    (project / "sub" / "draft.txt").write_text("mine")
    run = project / "runs" / "old"
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project / "sub")
    return project


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


DANGEROUS = {
    "the manifest's folder, from a sub-folder": ("..", "it holds the current folder"),
    "the current folder": (".", "it is the current folder"),
    "the home folder": ("~home", "it is your home folder"),
    "a parent of the manifest": ("../..", "it is your home folder"),
    "a run with a user's file": ("runs/old+notes", "holds files the run did not write: notes.txt"),
    "a run with a user's folder in checkpoints": ("runs/old+export", "checkpoints/export"),
    "a folder that is not a run": ("../runs/data", "it is not a run's folder"),
    "a link to a run": ("link", "it is a symbolic link"),
    "the manifest's folder, from outside it": ("project-from-home", "it holds the manifest"),
}


@pytest.mark.parametrize("target, reason", DANGEROUS.values(), ids=DANGEROUS)
def test_overwrite_refuses_what_is_not_recognisably_a_run_and_deletes_nothing(scratch, capsys, target, reason):
    if target == "~home":
        target = str(scratch.parent)
    elif target == "runs/old+notes":
        (scratch / "runs" / "old" / "notes.txt").write_text("mine too")
        target = str(scratch / "runs" / "old")
    elif target == "runs/old+export":
        (scratch / "runs" / "old" / "checkpoints" / "export").mkdir()
        target = str(scratch / "runs" / "old")
    elif target == "../runs/data":
        (scratch / "runs" / "data").mkdir()
        (scratch / "runs" / "data" / "table.csv").write_text("a,b\n")
    elif target == "link":
        (scratch / "sub" / "link").symlink_to(scratch / "runs" / "old")
    elif target == "project-from-home":
        (scratch.parent / "elsewhere").mkdir()
        os.chdir(scratch.parent / "elsewhere")  # the fixture's monkeypatch.chdir restores the folder
        target = str(scratch)
    before = _everything(scratch.parent)
    assert main(["train", str(scratch / "m.yaml"), "--output-dir", target, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--overwrite refuses to delete" in err and reason in err and "nothing was deleted" in err
    assert _everything(scratch.parent) == before


def test_overwrite_says_what_it_deletes(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "--max-steps", "1") == 0
    capsys.readouterr()
    assert _train(out, "--max-steps", "1", "--overwrite") == 0
    err = capsys.readouterr().err
    assert f"overwrite: deleting {out}: .agilerl-run, checkpoints/ (step-000001), loss_curve.png, metrics.jsonl" in err
