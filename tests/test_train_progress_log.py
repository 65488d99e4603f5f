"""``agilerl train`` run from a script with its output to a file: the progress is plain lines at
intervals (step/total, the latest numbers, elapsed, time left), not a bar squeezed into one cut
line (``train ━━━ 100… elapsed 0:… left 0:0…``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SFT = Path(__file__).resolve().parents[1] / "examples" / "sft" / "manifest.yaml"


@pytest.mark.slow
def test_train_writing_to_a_file_prints_plain_progress_lines(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    with log.open("w") as out:  # no --no-progress: the bar was asked for, and the output is a file
        done = subprocess.run(
            [sys.executable, "-m", "agilerl", "train", str(SFT), "--max-steps", "3", "--output-dir", str(tmp_path / "run")],
            stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"], text
    assert all(" loss " in line and " elapsed 0:" in line and " left ~0:" in line for line in lines), text
    assert "━" not in text and "\x1b[" not in text  # no bar, no terminal codes
