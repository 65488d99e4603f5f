"""Listings piped to another program are plain aligned columns: one line per row, nothing cut."""

from __future__ import annotations

import subprocess
import sys


def test_a_piped_listing_is_plain_unwrapped_columns():
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "rubrics", "list"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["Name", "Description", "Plugin", "Status"]
    row = next(line for line in lines if line.startswith("think_answer_format "))
    assert "The completion is <think>...</think><answer>...</answer>." in row  # whole, on one line
    assert not any(ch in result.stdout for ch in "┃│━")
