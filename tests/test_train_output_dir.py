"""A fresh `agilerl train` never mixes with an earlier run in the same output_dir."""

from __future__ import annotations

import json
from pathlib import Path

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
