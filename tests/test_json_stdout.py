"""Every ``--json`` command's stdout is its JSON alone (``| jq`` works), whatever a plugin or an
env writes meanwhile: ``print`` or ``os.write(1, ...)``, at import, in a hook, in any env method,
or from a thread of its own that keeps writing. Real plugin distributions, real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.registry.testing import write_distribution

LOUD = "import os\ndef loud(where):\n    print('print', where)\n    os.write(1, f'os.write {where}\\n'.encode())\n"
PLUGIN = LOUD + """
import threading, time
from agilerl import hookimpl

loud('at import')

def _chatter():  # a thread of the plugin's own, writing to fd 1 until the process ends
    while True:
        os.write(1, b'chatter\\n')
        time.sleep(0.002)

threading.Thread(target=_chatter, daemon=True).start()

@hookimpl
def register_envs(register):
    loud('in the hook')
    register('chatty-env', 'chatty_plugin.env:Env', description='writes everywhere')
"""
ENV = LOUD + """
loud('at the env module import')

class Env:
    max_turns = 2

    def __init__(self):
        loud('in __init__')

    def reset(self, seed=None):
        loud('in reset')
        return 'Say a number.', {}

    def step(self, action):
        loud('in step')
        return 'ok', 1.0, True, False, {}

    def close(self):
        loud('in close')
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    write_distribution(site, "agilerl-env-chatty", "1.0",
                       {"chatty_plugin/__init__.py": PLUGIN, "chatty_plugin/env.py": ENV}, plugins={"chatty": "chatty_plugin"})
    return site


def _json_of(site: Path, tmp_path: Path, *args: str) -> object:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    env.update(PYTHONPATH=str(site), AGILERL_PLUGINS="agilerl,chatty")
    done = subprocess.run([sys.executable, "-m", "agilerl", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "print at import" in done.stderr and "os.write at import" in done.stderr  # said, on stderr
    return json.loads(done.stdout)  # nothing but the JSON


def test_plugins_list_and_every_kind_list_print_only_their_json(site, tmp_path):
    rows = _json_of(site, tmp_path, "plugins", "list")
    assert [(row["name"], row["status"]) for row in rows] == [("chatty", "ok")]
    assert "chatty-env" in [row["name"] for row in _json_of(site, tmp_path, "envs", "list")]


def test_env_check_prints_only_its_json_whatever_the_env_writes(site, tmp_path):
    summary = _json_of(site, tmp_path, "env", "check", "chatty-env", "--episodes", "2")
    assert summary["problems"] == [] and summary["episodes"] == 2 and summary["rewards"] == [1.0, 1.0]


@pytest.mark.slow
def test_eval_prints_only_its_json_whatever_the_env_writes(site, tmp_path):
    summary = _json_of(site, tmp_path, "eval", "chatty-env", "--model", "tiny", "-n", "2", "--max-new-tokens", "2",
                       "--output", str(tmp_path / "out.jsonl"))
    assert summary["episodes"] == 2 and summary["reward_mean"] == 1.0


def test_with_stdout_closed_the_json_goes_nowhere_not_to_stderr(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agilerl", "envs", "list", "--json"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, preexec_fn=lambda: os.close(1))
    assert done.returncode == 0, done.stderr
    assert '"name"' not in done.stderr


def test_a_thread_left_running_never_writes_to_stdout_as_the_guard_is_left(tmp_path):
    """The moment between leaving the guard and seeing the thread left running: a write made
    right as the guard is left (the plugin thread's write in CI) goes to stderr, not after the JSON."""
    script = """
import os, threading
from agilerl.cli.json_output import json_only_stdout, print_json
from agilerl.stdout_guard import StdoutToStderr

go, done = threading.Event(), threading.Event()

def chatter():
    while go.wait():
        go.clear()
        os.write(1, b'chatter\\n')
        done.set()

leave = StdoutToStderr.__exit__
def leave_then_chatter(self, *exc):
    leave(self, *exc)
    go.set()
    assert done.wait(10)

StdoutToStderr.__exit__ = leave_then_chatter
with json_only_stdout():
    threading.Thread(target=chatter, daemon=True).start()
    print_json({"ok": True})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True} and "chatter" in done.stderr


def test_a_thread_left_by_one_json_command_does_not_hold_fd_1_for_later_guards(tmp_path):
    """A caller that runs commands in process (a test, a notebook) and puts its own fd 1 back
    after a --json command that left a thread: a later guard puts fd 1 back too, as if no
    command had run before (the left thread is not remembered)."""
    script = """
import os, threading
from agilerl.cli.json_output import json_only_stdout, print_json
from agilerl.stdout_guard import StdoutToStderr

mine = os.dup(1)
with json_only_stdout():
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # alive to the end
    print_json({"ok": True})
os.write(1, b'to stderr\\n')
os.dup2(mine, 1)  # the caller's own fd 1 back
with StdoutToStderr():
    os.write(1, b'inside\\n')
os.write(1, b'after\\n')
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("}\nafter\n") and "to stderr" in done.stderr and "inside" in done.stderr
