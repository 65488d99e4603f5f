"""tests/xdist_units.py: each run of a file's tests is one xdist worker's unit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.xdist_units import units

ROOT = Path(__file__).resolve().parent.parent


def test_a_file_seen_twice_in_the_collection_is_two_units():
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "a.py::t3[vllm]", "c.py::t1", "c.py::t2"]
    assert units(ids) == {
        "a.py::t1": "a.py#0", "a.py::t2": "a.py#0", "b.py::t1": "b.py#0",
        "a.py::t3[vllm]": "a.py#1", "c.py::t1": "c.py#0", "c.py::t2": "c.py#0",
    }


def test_on_two_workers_a_modules_fixture_is_built_once_and_its_tests_share_a_worker(tmp_path: Path):
    """Through the suite's own conftest hook, as ``python -m pytest`` runs it (``-n 2``)."""
    log = tmp_path / "setups.txt"
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / f"test_{name}.py").write_text(textwrap.dedent(f"""
            import os, pytest

            @pytest.fixture(scope="module")
            def shared():
                with open({str(log)!r}, "a") as f:
                    f.write("{name} setup " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

            @pytest.mark.parametrize("i", range(6))
            def test_uses_it(shared, i):
                with open({str(log)!r}, "a") as f:
                    f.write("{name} test " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        """))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
         "--import-mode=importlib", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = log.read_text().split()
    for name in ("alpha", "beta", "gamma"):
        seen = list(zip(lines[0::3], lines[1::3], lines[2::3]))
        assert sum(1 for n, what, _ in seen if n == name and what == "setup") == 1
        assert len({worker for n, _, worker in seen if n == name}) == 1
