"""Thousands of malformed and random frames: each gets one observation, state or error reply,
the session survives, and another session keeps playing throughout."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agilerl.remote.client import RemoteEnvClient
from agilerl.concurrency import shared_loop
from agilerl.remote.client import client_session
from agilerl.remote.hosting import resolve_env
from tests.test_remote_server import assert_all_closed_once, fresh_env_class

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
frame_types = st.sampled_from(["reset", "step", "state", "mcp", "", "STEP", "observation"]) | st.text(max_size=8)
frame_data = json_values | st.fixed_dictionaries(
    {},
    optional={
        "seed": json_values,
        "message": st.text(max_size=20) | json_values,
        "row_index": json_values,
        "evaluation": json_values,
    },
)
frame_objects = st.fixed_dictionaries({}, optional={"type": frame_types, "data": frame_data, "extra": json_values})
frames = st.one_of(
    st.text(max_size=40),
    json_values.map(json.dumps),
    frame_objects.filter(lambda f: f.get("type") != "close").map(json.dumps),
    st.binary(max_size=40),
)

REPLY_TYPES = {"observation", "state", "error", "mcp"}


class RawSession:
    """One persistent socket on the shared client loop, driven synchronously."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = shared_loop()
        self.ws: Any = self.loop.run(self._open())

    async def _open(self) -> Any:
        return await client_session().ws_connect(self.url + "/ws")

    def exchange(self, frame: str | bytes) -> Any:
        return self.loop.run(self._exchange(frame))

    async def _exchange(self, frame: str | bytes) -> Any:
        if isinstance(frame, bytes):
            await self.ws.send_bytes(frame)
        else:
            await self.ws.send_str(frame)
        msg = await self.ws.receive(timeout=10)
        return json.loads(msg.data)

    def close(self) -> None:
        self.loop.run(self.ws.close())


def test_random_frames_always_get_one_reply_and_never_break_the_server() -> None:
    env_cls = fresh_env_class()
    url, server = resolve_env(env_cls, {"max_turns": 10**9})
    with server:
        fuzzed = RawSession(url)
        canary = RemoteEnvClient(url)
        canary.reset(seed=0)
        sent = []

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(frames, min_size=1, max_size=8))
        def check(batch: list[str | bytes]) -> None:
            for frame in batch:
                reply = fuzzed.exchange(frame)
                assert reply["type"] in REPLY_TYPES, (frame, reply)
                if reply["type"] == "error":
                    assert reply["data"]["code"] in {
                        "INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR"
                    }, (frame, reply)
                sent.append(frame)
            assert canary.step("still here")[0] == "STILL HERE"

        check()
        assert len(sent) > 1000
        assert server.active_sessions == 2
        fuzzed.close()
        canary.close()
        assert_all_closed_once(server, env_cls, built=2)
