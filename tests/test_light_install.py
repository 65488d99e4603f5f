"""The plain install is the env side: it pulls no training stack, stays small, and every command
that needs an extra says which one in one line (exit 2), never with a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "datasets", "pyarrow", "accelerate")
MAX_ADDED_MB = 100  # 74 MB before uvloop (the env server's loop, about 17 MB) joined the plain install

pytestmark = pytest.mark.slow  # a fresh venv with the plain install (about 20 s), shared by the module

GUESS_ENV = '''
import random

class GuessEnv:
    max_turns = 3

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(1, 10)
        return "Guess a number between 1 and 10.", {}

    def step(self, action):
        guess = int(action)
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        return ("Too high!" if guess > self.target else "Too low!"), 0.0, False, False, {}
'''


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare venv with the project installed from source, no extras."""
    where = tmp_path_factory.mktemp("light") / "venv"
    venv.EnvBuilder(with_pip=True).create(where)
    bare_mb = _size_mb(where)
    python = where / "bin" / "python"
    source = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT, source / "project", ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "*.egg-info", "build"))
    subprocess.run(
        [python, "-m", "pip", "install", "-q", str(source / "project")], check=True, capture_output=True, text=True
    )
    where.joinpath("bare_mb").write_text(str(bare_mb))
    return where


def _run(venv_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGILERL_", "PYTHON"))}
    return subprocess.run(
        [str(venv_dir / "bin" / "agilerl"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_the_plain_install_pulls_no_training_stack_and_stays_small(light_venv: Path) -> None:
    python = light_venv / "bin" / "python"
    found = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([m for m in {HEAVY!r} if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert found == "[]"
    added = _size_mb(light_venv) - float(light_venv.joinpath("bare_mb").read_text())
    print(f"plain install adds {added:.0f} MB to a bare venv")
    assert added <= MAX_ADDED_MB


def test_env_side_commands_work_without_extras(light_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "guess_env.py").write_text(GUESS_ENV)
    checked = _run(light_venv, "env", "check", "guess_env.py:GuessEnv", "--actions", "5", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "[user] Guess a number between 1 and 10." in checked.stdout
    assert "[assistant] 5" in checked.stdout
    listed = _run(light_venv, "algorithms", "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert '"grpo"' in listed.stdout


def test_a_command_needing_an_extra_names_it_in_one_line(light_venv: Path, tmp_path: Path) -> None:
    trained = _run(light_venv, "train", str(ROOT / "examples" / "guess" / "manifest.yaml"), cwd=tmp_path)
    assert trained.returncode == 2
    assert trained.stderr.strip().count("\n") == 0
    assert "needs the 'train' extra" in trained.stderr
    assert "pip install 'agilerl-envlayer[train]'" in trained.stderr
    (tmp_path / "guess_env.py").write_text(GUESS_ENV)
    templated = _run(light_venv, "env", "check", "guess_env.py:GuessEnv", "--tokenizer", "tiny", cwd=tmp_path)
    assert templated.returncode == 2
    assert "agilerl env check needs the 'train' extra" in templated.stderr
    assert "Traceback" not in trained.stderr + templated.stderr


def test_the_scaffolds_printed_next_step_works_as_printed_in_a_fresh_venv(light_venv: Path, tmp_path: Path) -> None:
    """``agilerl plugins new`` prints its next step; run as printed in a venv holding agilerl and
    no pytest, it installs the plugin with pytest (its [test] extra) and the plugin's tests pass."""
    python = light_venv / "bin" / "python"
    has_pytest = [python, "-c", "import importlib.util as u; print(u.find_spec('pytest') is not None)"]
    assert subprocess.run(has_pytest, capture_output=True, text=True, check=True).stdout.strip() == "False"
    made = _run(light_venv, "plugins", "new", "demo", "--dir", str(tmp_path), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    next_step = next(line for line in made.stdout.splitlines() if line.startswith("Next: ")).removeprefix("Next: ")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGILERL_", "PYTHON"))}
    env["PATH"] = f"{light_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # the venv activated
    ran = subprocess.run(["bash", "-c", next_step], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "3 passed" in ran.stdout
