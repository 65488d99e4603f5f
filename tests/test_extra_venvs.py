"""tests/extra_venvs.py: the extra venvs build once, under a lock, whoever asks first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from agilerl.registry.testing import overlay_venv
from tests import extra_venvs

ROOT = Path(__file__).resolve().parent.parent


def test_two_processes_ensuring_one_venv_build_it_once(tmp_path: Path):
    """Both start while the venv is missing; the second waits for the first's build, then finds it done."""
    builds = tmp_path / "builds.txt"
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from tests.extra_venvs import ExtraVenv

        step = ("import time; open({str(builds)!r}, 'a').write('build\\\\n'); time.sleep(1); "
                "open({str(tmp_path / 'built')!r}, 'w').close()")
        venv = ExtraVenv(
            "lock-test-{os.getpid()}", "import os, sys; sys.exit(not os.path.exists({str(tmp_path / 'built')!r}))",
            lambda python: [[python, "-c", step]], root=Path({str(tmp_path)!r}), with_pip=False,
        )
        print(venv.ensure())
    """)
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert builds.read_text() == "build\n"  # one build: the other process waited, then found it complete
    assert {out.strip() for out, _ in outputs} == {str(tmp_path / f".venv-lock-test-{os.getpid()}" / "bin" / "python")}


def _venv_seeing_the_suite(root: Path, probe: str) -> extra_venvs.ExtraVenv:
    return extra_venvs.ExtraVenv("sees-suite", probe, lambda python: [], sees_suite=True, root=root, with_pip=False)


def test_a_venv_seeing_the_suite_imports_this_checkout_from_the_suites_interpreter(tmp_path: Path):
    """The editable install of the interpreter running the tests (in the dev set-up, a virtualenv)
    is what the extra venv imports, probed from outside the checkout."""
    import agilerl

    probe = f"import agilerl; assert agilerl.__file__ == {agilerl.__file__!r}, agilerl.__file__"
    python = _venv_seeing_the_suite(tmp_path, probe).ensure()
    assert subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True).returncode == 0


def test_a_suite_run_from_a_virtualenv_gives_its_extra_venv_that_virtualenvs_packages(tmp_path: Path):
    """A new user's set-up: the suite runs in a virtualenv (here one over this interpreter's
    packages, with two of its own) whose base interpreter lacks its packages. The extra venv sees
    the virtualenv's: a module, and a folder its ``.pth`` adds, as an editable install's does
    (``venv --system-site-packages`` gave the base's)."""
    suite_python, purelib = overlay_venv(tmp_path / "suite-venv")
    (purelib / "only_in_the_suite_venv.py").write_text("")
    editable = tmp_path / "editable-source"
    editable.mkdir()
    (editable / "only_through_a_pth.py").write_text("")
    (purelib / "editable.pth").write_text(f"{editable}\n")
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from tests.extra_venvs import ExtraVenv

        venv = ExtraVenv("sees-suite", "import only_in_the_suite_venv, only_through_a_pth", lambda python: [],
                         sees_suite=True, root=Path({str(tmp_path)!r}), with_pip=False)
        print(venv.ensure())
    """)
    built = subprocess.run([str(suite_python), "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]


def test_a_probed_venv_is_probed_again_only_after_an_install_changes_it(tmp_path: Path):
    """The probe (vllm's imports: 6 s of CPU) runs once; a stamp stands for it until a package is
    installed or removed in the venv, or its probe changes."""
    runs = tmp_path / "probes.txt"
    probe = f"open({str(runs)!r}, 'a').write('probe\\n')"
    venv = extra_venvs.ExtraVenv("stamped", probe, lambda python: [], root=tmp_path, with_pip=False)
    venv.ensure()
    venv.ensure()
    assert runs.read_text() == "probe\n"  # the build's; the second ensure trusted the stamp
    (next(venv.path.glob("lib/python*/site-packages")) / "installed_later.py").write_text("")
    venv.ensure()
    assert runs.read_text() == "probe\n" * 2
    failing = extra_venvs.ExtraVenv("stamped", "raise SystemExit(1)", lambda python: [], root=tmp_path, with_pip=False)
    assert not failing.ready()  # a changed probe is run, not trusted
