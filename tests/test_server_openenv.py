"""`agilerl serve` hosts OpenEnv's own envs as openenv's server does, on openenv-core's real base
classes (in the side venv of tests/test_remote_openenv.py):

- an MCP env's async methods are awaited and its MCP session is held for the whole WebSocket
  session (FastMCP's per-session state survives from one step to the next);
- a sync env runs every call on its session's one thread (an sqlite connection made in
  ``__init__`` works) and, not declaring ``SUPPORTS_CONCURRENT_SESSIONS``, gets one session, with
  a start-up note;
- HTTP ``/reset``, ``/step``, ``/state``, ``/mcp`` and the ``mcp`` frame answer as OpenEnv's do;
- ``/metadata`` describes the env class, ``/schema`` gives its own Observation class.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from tests.test_openenv_native import side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401 - side_python needs it

ENVS = textwrap.dedent('''
    import asyncio, contextlib, sqlite3, threading
    from fastmcp import FastMCP
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Action, Observation, State


    class TallyObservation(Observation):
        thread: str = ""


    class TallyEnv(MCPEnvironment):
        """Counts how often its MCP client session is opened (outermost entries)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            mcp = FastMCP("tally")
            self.opened, self._depth = 0, 0

            @mcp.tool
            def sessions() -> int:
                """MCP client sessions this env opened so far."""
                return self.opened

            super().__init__(mcp)
            self._state = State(step_count=0)

        @contextlib.asynccontextmanager
        async def mcp_session(self):
            self._depth += 1
            self.opened += self._depth == 1
            try:
                async with super().mcp_session() as client:
                    yield client
            finally:
                self._depth -= 1

        def reset(self, seed=None, episode_id=None, **kwargs):
            raise AssertionError("the server awaits reset_async")

        async def reset_async(self, seed=None, episode_id=None, **kwargs):
            await asyncio.sleep(0)
            return TallyObservation(thread=threading.current_thread().name)

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation(done=False)

        @property
        def state(self):
            return self._state


    class WordAction(Action):
        word: str


    class WordObservation(Observation):
        said: str = ""
        thread: str = ""


    class DiaryEnv(Environment[WordAction, WordObservation, State]):
        """Writes each word to an sqlite diary opened in __init__ (bound to its thread)."""

        def __init__(self):
            super().__init__()
            self.db = sqlite3.connect(":memory:")  # usable only on the thread that made it
            self.db.execute("create table words (word text)")
            self._state = State(step_count=0)

        def reset(self):
            self.db.execute("delete from words")
            return WordObservation(said="", thread=threading.current_thread().name)

        def step(self, action, timeout_s=None, **kwargs):
            self.db.execute("insert into words values (?)", (action.word,))
            said = " ".join(w for (w,) in self.db.execute("select word from words"))
            self._state.step_count += 1
            return WordObservation(said=said, thread=threading.current_thread().name, reward=1.0)

        @property
        def state(self):
            return self._state

        def close(self):
            self.db.close()
''')

CHECKS = textwrap.dedent('''
    import json, subprocess, sys, urllib.request
    from openenv.core.generic_client import GenericEnvClient
    from websockets.sync.client import connect

    def serve(entrypoint):
        proc = subprocess.Popen([sys.executable, "-m", "agilerl", "serve", entrypoint, "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = next(l for l in proc.stdout if l.startswith("serving "))
        return proc, line.split(" at ")[1].split()[0]

    def http(url, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.load(reply)

    def rpc(ws, method, **params):
        ws.send(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": method, "params": params, "id": 7}}))
        return json.loads(ws.recv(timeout=60))

    seen = {}
    (tally, tally_url), (diary, diary_url) = serve("envs.py:TallyEnv"), serve("envs.py:DiaryEnv")
    try:
        with GenericEnvClient(base_url=tally_url).sync() as client:
            seen["tally_reset"] = client.reset().observation
            call = {"type": "call_tool", "tool_name": "sessions", "arguments": {}}
            seen["tallies"] = [client.step(call).observation["result"]["data"] for _ in range(3)]
        with connect(tally_url.replace("http", "ws", 1) + "/ws") as ws:
            listed = rpc(ws, "tools/list")
            seen["listed"] = [listed["type"], [t["name"] for t in listed["data"]["result"]["tools"]]]
            seen["rpc_tallies"] = [rpc(ws, "tools/call", name="sessions", arguments={})["data"]["result"]["data"] for _ in range(2)]
            seen["rpc_unknown"] = rpc(ws, "nope")["data"]["error"]["code"]
        seen["http_mcp"] = [t["name"] for t in http(tally_url + "/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 1})["result"]["tools"]]
        seen["tally_schema"] = http(tally_url + "/schema")["observation"]["title"]

        with GenericEnvClient(base_url=diary_url).sync() as client:
            first = client.reset()
            steps = [client.step({"word": w}) for w in ("a", "b")]
            seen["diary"] = [first.observation] + [s.observation for s in steps]
            with connect(diary_url.replace("http", "ws", 1) + "/ws") as second:
                seen["second"] = json.loads(second.recv(timeout=60))["data"]["code"]
        seen["http_reset"] = http(diary_url + "/reset", {})
        seen["http_step"] = http(diary_url + "/step", {"action": {"word": "solo"}})
        seen["http_state"] = http(diary_url + "/state")
        meta = http(diary_url + "/metadata")
        seen["diary_meta"] = [meta["description"], meta["max_concurrent_envs"]]
        seen["diary_schema"] = http(diary_url + "/schema")["observation"]["title"]
    finally:
        for proc in (tally, diary):
            proc.terminate()
        seen["diary_stderr"] = diary.communicate(timeout=30)[1]
        tally.wait(30)
    print(json.dumps(seen))
''')


def test_openenv_envs_are_served_as_openenv_serves_them(side_python: Path, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "envs.py").write_text(ENVS)
    (tmp_path / "checks.py").write_text(CHECKS)
    done = subprocess.run([str(side_python), "checks.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    # MCP env: reset_async awaited on the server's loop; one MCP client session held for the
    # whole WebSocket session (one opened per step would count 1, 2, 3)
    assert seen["tally_reset"] == {"thread": "MainThread"}  # its sync reset raises
    assert seen["tallies"] == [1, 1, 1]
    assert seen["listed"] == ["mcp", ["sessions"]]
    assert seen["rpc_tallies"] == [1, 1]  # the mcp frame runs in the held session too
    assert seen["rpc_unknown"] == -32601
    assert seen["http_mcp"] == ["sessions"]
    assert seen["tally_schema"] == "CallToolObservation"

    # sync, thread-bound env: every call on the session's one thread, the sqlite diary works
    reset, *steps = seen["diary"]
    assert [s["said"] for s in steps] == ["a", "a b"]
    assert len({reset["thread"], *(s["thread"] for s in steps)}) == 1
    assert reset["thread"].startswith("agilerl-session-")
    # not declaring SUPPORTS_CONCURRENT_SESSIONS: one session at a time, said at start-up
    assert seen["second"] == "CAPACITY_REACHED"
    assert "DiaryEnv does not declare SUPPORTS_CONCURRENT_SESSIONS = True" in seen["diary_stderr"]
    assert seen["diary_meta"] == ["Writes each word to an sqlite diary opened in __init__ (bound to its thread).", 1]
    # HTTP routes as OpenEnv defines them: each call on a fresh env
    assert seen["http_reset"]["observation"]["said"] == "" and seen["http_reset"]["done"] is False
    assert seen["http_step"]["observation"]["said"] == "solo" and seen["http_step"]["reward"] == 1.0
    assert seen["http_state"] == {"episode_id": None, "step_count": 0}
    assert seen["diary_schema"] == "WordObservation"  # reset has no return annotation
