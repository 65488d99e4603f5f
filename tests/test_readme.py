"""The README runs as written: its tour, and set-up and install lines that name real things."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    """The tour's blocks: the env file (it starts with its file name) and what follows it."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    start = next(i for i, b in enumerate(blocks) if b.startswith("# guess_env.py"))
    return blocks[start:]


def test_readme_guess_env_runs_through_the_harness(tmp_path):
    env_block, harness_block = _python_blocks()[:2]
    (tmp_path / "guess_env.py").write_text(env_block)
    script = harness_block + "\nassert len(traj.token_ids) == len(traj.action_mask) == len(traj.turn_ids)\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    printed = re.search(r"It prints what the harness recorded: `(.*?)`", README.read_text(), flags=re.S).group(1)
    assert result.stdout.strip() == " ".join(printed.split())  # the snippet prints what the README says


def test_readme_env_check_command_runs(tmp_path):
    env_block = _python_blocks()[0]
    (tmp_path / "guess_env.py").write_text(env_block)
    command = re.search(r"^agilerl env check .*$", README.read_text(), flags=re.M).group(0).split()
    result = subprocess.run([sys.executable, "-m", "agilerl", *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "episodes=2" in result.stdout


SET_UP = [
    'pip install torch==2.13.0 && pip install -e ".[train,plot]" && agilerl train examples/guess/manifest.yaml',
    (
        # the plugins after the project: they depend on agilerl-envlayer, which pip 23 (Python
        # 3.11's bundled pip) cannot resolve from a path in the same command
        'pip install torch==2.13.0 && pip install -e ".[dev]" && pip install ./plugins/agilerl-env-gem '
        "./plugins/agilerl-env-textarena ./plugins/agilerl-env-reasoning-gym && python -m pytest"
    ),
]


def _section(title: str) -> str:
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_set_up_is_the_two_commands():
    assert re.findall(r"```bash\n(.*?)\n```", _section("Set up"), flags=re.S) == SET_UP


def test_every_extra_path_and_distribution_the_readme_names_exists():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    text = README.read_text()
    assert f"pip install {project['name']}" in _section("Install")
    extras = set(re.findall(r"\[(\w+(?:,\w+)*)\]", _section("Install") + "\n".join(SET_UP)))
    named = {extra for group in extras for extra in group.split(",")}
    assert {"train", "datasets", "plot", "dev"} <= named <= set(project["optional-dependencies"])
    for path in re.findall(r"\./(plugins/[\w-]+)", text) + re.findall(r"\b(examples/[\w/.-]+\.yaml)", text):
        assert (README.parent / path).exists(), path


def test_readme_tour_manifest_is_valid_and_says_it_does_not_learn(tmp_path):
    (tmp_path / "guess_env.py").write_text(_python_blocks()[0])
    manifest = next(b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S) if "guess_env.py:GuessEnv" in b)
    (tmp_path / "manifest.yaml").write_text(manifest)
    result = subprocess.run([sys.executable, "-m", "agilerl", "manifest", "validate", "manifest.yaml"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    tour = _section("A five-minute tour")
    assert "not learning" in tour and "examples/guess/manifest.yaml" in tour  # and where the run that learns is


def test_a_misspelt_env_next_to_its_file_is_named_not_called_uninstalled(tmp_path):
    """``agilerl env check guess_env:GuesEnv`` beside guess_env.py (the console script, whose path
    lacks the current folder) finds the file and names what it holds."""
    (tmp_path / "guess_env.py").write_text(_python_blocks()[0])
    script = Path(sys.executable).with_name("agilerl")
    result = subprocess.run([str(script), "env", "check", "guess_env:GuesEnv"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "not installed" not in result.stderr
    assert "has no attribute 'GuesEnv'" in result.stderr and "GuessEnv" in result.stderr.split("It has:")[1]
