"""The README's tour runs verbatim: its env file and its harness snippet."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    """The tour's blocks: the env file (it starts with its file name) and what follows it."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    start = next(i for i, b in enumerate(blocks) if b.startswith("# guess_env.py"))
    return blocks[start:]


def test_readme_guess_env_runs_through_the_harness(tmp_path):
    env_block, harness_block = _python_blocks()[:2]
    (tmp_path / "guess_env.py").write_text(env_block)
    script = harness_block + "\nassert traj.rewards and len(traj.token_ids) == len(traj.action_mask)\nprint('rewards', traj.rewards)\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "rewards [" in result.stdout


def test_readme_env_check_command_runs(tmp_path):
    env_block = _python_blocks()[0]
    (tmp_path / "guess_env.py").write_text(env_block)
    command = re.search(r"^agilerl env check .*$", README.read_text(), flags=re.M).group(0).split()
    result = subprocess.run([sys.executable, "-m", "agilerl", *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "episodes=2" in result.stdout
