"""Issue 34 (round 3), ``agilerl serve`` as a process: SIGHUP stops it like SIGTERM (its envs
closed), a stop with an env whose ``close()`` hangs ends within the documented 10 s grace, and a
token no client could send is refused at start-up (exit 2) instead of refusing everyone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from agilerl.remote.client import RemoteEnvClient
from tests.signals import as_from_a_terminal, as_under_nohup

ENV = textwrap.dedent("""
    import os, pathlib, time

    class Marked:
        '''Marks each close in MARK_DIR; a played env's close hangs when HANG_CLOSE is set.'''

        def __init__(self):
            self.played = False

        def reset(self, seed=None):
            self.played = True
            return "hi", {}

        def step(self, action):
            return "ok", 0.0, False, False, {}

        def close(self):
            marks = pathlib.Path(os.environ["MARK_DIR"])
            (marks / f"closed-{id(self)}").touch()
            if self.played and os.environ.get("HANG_CLOSE"):
                time.sleep(600)
""")


def _serve(tmp_path: Path, *extra: str, hang: bool = False, nohup: bool = False) -> tuple[subprocess.Popen[str], str]:
    (tmp_path / "marked.py").write_text(ENV)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARK_DIR": str(marks), **({"HANG_CLOSE": "1"} if hang else {})}
    env.pop("AGILERL_ENV_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agilerl", "serve", f"{tmp_path / 'marked.py'}:Marked", "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=as_under_nohup if nohup else as_from_a_terminal,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving ... at URL ..." (or nothing: it failed)
    if not line.startswith("serving "):
        proc.kill()
        raise AssertionError(f"serve did not start: {line!r} {proc.communicate(timeout=30)}")
    return proc, line.split(" at ")[1].split()[0]


def _closes(tmp_path: Path) -> int:
    return len(list((tmp_path / "marks").iterdir()))


def _finish(proc: subprocess.Popen[str], limit_s: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate(timeout=30)
        raise AssertionError(f"serve still running {limit_s} s after the signal: {out}") from None


@pytest.mark.slow
def test_sighup_stops_serve_like_sigterm_and_closes_its_envs(tmp_path: Path) -> None:
    proc, url = _serve(tmp_path)
    client = RemoteEnvClient(url)
    client.reset()
    assert _closes(tmp_path) == 1  # the env built at start-up to check --env-config
    proc.send_signal(signal.SIGHUP)
    out, err = _finish(proc, 60)
    assert proc.returncode == 0, err
    assert out.strip().endswith("stopped")
    assert _closes(tmp_path) == 2  # and the session's env
    client.close()


@pytest.mark.slow
def test_under_nohup_sighup_is_still_ignored(tmp_path: Path) -> None:
    proc, url = _serve(tmp_path, nohup=True)
    proc.send_signal(signal.SIGHUP)
    threading.Event().wait(0.5)  # a stop would have begun by now
    with RemoteEnvClient(url, retry_budget_s=0) as client:
        assert client.reset()[0] == "hi"
    assert proc.poll() is None
    proc.terminate()
    _finish(proc, 60)
    assert proc.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_hung_env_close_keeps_a_sigterm_stop_within_the_grace(tmp_path: Path) -> None:
    """``close()`` sleeps 600 s: the stop abandons it after the 10 s grace (aiohttp's own 60 s
    wait for handlers used to come after it: 70 s in all)."""
    proc, url = _serve(tmp_path, hang=True)
    client = RemoteEnvClient(url)
    client.reset()
    proc.send_signal(signal.SIGTERM)
    out, err = _finish(proc, 40)  # the grace is 10 s; 40 leaves a loaded host room, 70 fails
    assert proc.returncode == 0, err
    assert out.strip().endswith("stopped")
    assert _closes(tmp_path) == 2  # the hung close did start
    client.close()


def test_serve_refuses_a_token_it_could_never_match_and_strips_a_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "marked.py").write_text(ENV)
    (tmp_path / "marks").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "agilerl", "serve", f"{tmp_path / 'marked.py'}:Marked", "--port", "0", "--token", "to ken"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "MARK_DIR": str(tmp_path / "marks")},
    )
    assert not list((tmp_path / "marks").iterdir())  # refused before any env was built
    assert done.returncode == 2 and "--token holds ' '" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_serve_started_with_a_newline_ended_token_admits_the_client(tmp_path: Path) -> None:
    proc, url = _serve(tmp_path, "--token", "secret\n")
    try:
        with RemoteEnvClient(url, token="secret") as client:
            assert client.reset()[0] == "hi"
    finally:
        proc.terminate()
        _finish(proc, 60)
    assert proc.returncode == 0
