"""Peers' replies are read under a byte cap, their numbers must be finite, their URLs are printed
without userinfo and their keys are checked where they are read: against real aiohttp servers on
127.0.0.1 (a judge that streams an endless body, one that answers a million-digit number, one
that fails), each refusal naming the URL, the cap and the setting."""

from __future__ import annotations

import asyncio
import math
import tracemalloc
from collections.abc import Iterator

import pytest

from agilerl.data.judge import JudgeEndpoint
from agilerl.data.judges import LLMJudge
from agilerl.errors import JudgeFailed, RubricError
from agilerl.peers import redact, secret_from_env
from tests.loopback import LoopbackServer

KEY_ENV = "AGILERL_TEST_PEER_KEY"


def _chat(content: str) -> dict:
    return {"choices": [{"message": {"content": content}}]}


@pytest.fixture
def peer() -> Iterator[LoopbackServer]:
    """``/v1/chat/completions`` answers by the request's prompt: ``stream`` (200, an endless body
    without Content-Length), ``long`` (200, Content-Length 5 MB), ``digits`` (a 100,000-digit
    score), ``fail`` (500); anything else echoes 400 characters back, as a score of 7."""
    from aiohttp import web

    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        prompt = (await request.json())["messages"][-1]["content"]
        seen.append(request.headers.get("Authorization"))
        if prompt == "stream":
            response = web.StreamResponse()
            await response.prepare(request)
            chunk = b"9" * (1 << 20)
            for _ in range(200):  # 200 MB, unless the reader stops
                await response.write(chunk)
            return response
        if prompt == "long":
            return web.Response(body=b"1" * 5_000_000, content_type="application/json")
        if prompt == "digits":
            return web.json_response(_chat("Score: " + "9" * 100_000))
        if prompt == "fail":
            return web.Response(status=500, text="internal error")
        return web.json_response(_chat(prompt.ljust(400, ".") + " Score: 7"))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = LoopbackServer(app, "peer")
    server.seen = seen  # type: ignore[attr-defined]
    yield server
    server.stop()


def _complete(endpoint: JudgeEndpoint, prompt: str) -> str:
    return endpoint._loop.run(endpoint.complete(prompt))


def test_a_judge_body_past_the_cap_fails_the_judgement_without_being_read_whole(peer: LoopbackServer) -> None:
    endpoint = JudgeEndpoint(peer.url + "/v1", "judge", retries=3, backoff_s=0)
    tracemalloc.start()
    try:
        with pytest.raises(JudgeFailed) as caught:
            _complete(endpoint, "stream")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "over the 4,194,304 bytes a reply is read up to" in message and "max_reply_bytes" in message
    assert f"{peer.url}/v1/chat/completions" in message and "after 1 attempt(s)" in message  # not retried
    assert peak < 40_000_000, peak  # the whole body would be 200 MB (and its text as much again)
    small = JudgeEndpoint(peer.url + "/v1", "judge", max_reply_bytes=1_000_000)
    with pytest.raises(JudgeFailed, match=r"a body of 5,000,000 bytes \(Content-Length\), over the 1,000,000"):
        _complete(small, "long")


def test_a_score_that_is_not_finite_is_no_score(peer: LoopbackServer) -> None:
    judge = LLMJudge("{completion}", base_url=peer.url + "/v1", model="judge", failure_score=0.25)
    assert judge.endpoint._loop.run(judge("digits")) == 0.25  # inf read from 100,000 digits: failed, not 1.0
    strict = LLMJudge("{completion}", base_url=peer.url + "/v1", model="judge", failure_score=None)
    with pytest.raises(JudgeFailed, match="holds no score"):
        strict.endpoint._loop.run(strict("digits"))
    assert judge.endpoint._loop.run(judge("fine")) == 0.7


@pytest.mark.parametrize(
    "options, key",
    [
        ({"labels": {"right": math.nan}}, "labels['right']"),
        ({"score_range": [0, math.nan]}, "score_range"),
        ({"score_range": [0, math.inf]}, "score_range"),
        ({"failure_score": math.nan}, "failure_score"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"give_up_after_s": math.inf}, "give_up_after_s"),
    ],
)
def test_a_judge_config_that_is_not_finite_is_refused_naming_the_key(options: dict, key: str) -> None:
    with pytest.raises(RubricError, match=r"judge " + key.replace("[", r"\[").replace("]", r"\]") + r".* finite"):
        LLMJudge(base_url="http://127.0.0.1:9/v1", model="judge", **options)


def test_the_reply_cache_is_bounded_by_bytes(peer: LoopbackServer) -> None:
    endpoint = JudgeEndpoint(peer.url + "/v1", "judge", cache_bytes=1_200)
    for prompt in ("a", "b", "c", "d", "e"):
        _complete(endpoint, prompt)  # ~470 bytes each with its key
    assert endpoint._cached_bytes <= 1_200 and len(endpoint._cache) == 2
    calls = len(peer.seen)  # type: ignore[attr-defined]
    _complete(endpoint, "e")  # the newest: kept
    _complete(endpoint, "a")  # the oldest: dropped, asked again
    assert len(peer.seen) == calls + 1  # type: ignore[attr-defined]


def test_a_password_in_the_judge_url_is_never_printed(peer: LoopbackServer) -> None:
    host = peer.url.removeprefix("http://")
    endpoint = JudgeEndpoint(f"http://user:PASS-1234@{host}/v1", "judge", retries=0)
    with pytest.raises(JudgeFailed) as caught:
        _complete(endpoint, "fail")
    assert "PASS-1234" not in str(caught.value) and f"http://***@{host}/v1/chat/completions" in str(caught.value)
    assert "PASS-1234" not in repr(endpoint)
    assert peer.seen[-1].startswith("Basic ")  # type: ignore[attr-defined]  # still sent, as basic auth
    closed = JudgeEndpoint("http://user:PASS-1234@127.0.0.1:9/v1", "judge", retries=0)
    with pytest.raises(JudgeFailed) as caught:
        _complete(closed, "x")
    assert "PASS-1234" not in str(caught.value)
    with pytest.raises(RubricError) as caught:
        JudgeEndpoint("ftp://user:PASS-1234@host/v1", "judge")
    assert "PASS-1234" not in str(caught.value)
    assert redact("at https://a:b@h:1/x and http://tok@h/y, not mail a@b.c") == (
        "at https://***@h:1/x and http://***@h/y, not mail a@b.c"
    )


def test_a_key_with_a_trailing_newline_is_stripped_with_a_warning_and_a_bad_one_is_named(
    peer: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-abc\n")
    with pytest.warns(UserWarning, match=rf"\${KEY_ENV}: stripped the whitespace"):
        endpoint = JudgeEndpoint(peer.url + "/v1", "judge", api_key_env=KEY_ENV)
    _complete(endpoint, "k")
    assert peer.seen[-1] == "Bearer sk-abc"  # type: ignore[attr-defined]
    monkeypatch.setenv(KEY_ENV, "sk-abc\ndef")
    with pytest.raises(RubricError, match=rf"judge api_key_env: \${KEY_ENV} holds '\\n' at position 6"):
        JudgeEndpoint(peer.url + "/v1", "judge", api_key_env=KEY_ENV)
    monkeypatch.setenv(KEY_ENV, "  ")
    with pytest.raises(Exception, match=rf"\${KEY_ENV} is blank"):
        secret_from_env(KEY_ENV)


def test_the_stream_cap_ends_the_read_early() -> None:
    """The reader stops at the cap however the body is cut into chunks (no Content-Length)."""
    from agilerl.errors import ReplyTooLarge
    from agilerl.peers import read_capped

    class Content:
        async def iter_chunked(self, size: int):
            for _ in range(1000):
                yield b"x" * 1000

    class Response:
        content_length = None
        content = Content()

    read = asyncio.run(read_capped(Response(), 1_000_000, url="http://u:p@h/x", setting="s"))
    assert len(read) == 1_000_000
    with pytest.raises(ReplyTooLarge, match=r"http://\*\*\*@h/x answered with a body past that, over the 999,999 bytes.*raise s"):
        asyncio.run(read_capped(Response(), 999_999, url="http://u:p@h/x", setting="s"))


@pytest.fixture
def flood() -> Iterator[LoopbackServer]:
    """A generation endpoint gone wrong: every POST answers 200 with an endless body."""
    from aiohttp import web

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(200):
            await response.write(b"7" * (1 << 20))
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", endless)
    server = LoopbackServer(app, "flood")
    yield server
    server.stop()


def test_generation_endpoints_read_replies_under_their_cap_and_print_no_password(
    flood: LoopbackServer, chatml_tokenizer: object, tmp_path: object
) -> None:
    from agilerl.errors import EndpointError
    from agilerl.generation.openai_policy import OpenAIChatPolicy
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.vllm.server import VLLMServerPolicy

    secret_url = flood.url.replace("http://", "http://user:PASS-1234@")
    params = SamplingParams(max_new_tokens=4)
    replica = VLLMServerPolicy([secret_url], chatml_tokenizer, weights_dir=tmp_path, max_model_len=64, max_reply_bytes=1_000_000)
    with pytest.raises(EndpointError) as caught:
        replica.generate([[1, 2, 3]], params)
    message = str(caught.value)
    assert "over the 1,000,000 bytes" in message and "generation.max_reply_bytes" in message
    assert "PASS-1234" not in message and "http://***@127.0.0.1" in message
    endpoint = OpenAIChatPolicy(secret_url + "/v1", "m", retries=0, max_reply_bytes=1_000_000)
    with pytest.raises(EndpointError) as caught:
        prompt = endpoint.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
        endpoint.generate([prompt], params)
    assert "over the 1,000,000 bytes" in str(caught.value) and "PASS-1234" not in str(caught.value)
    with pytest.raises(Exception, match=r"holds '\\n' at position 2"):
        OpenAIChatPolicy(flood.url + "/v1", "m", api_key="sk\nx")


def test_every_error_of_the_tree_prints_urls_without_their_userinfo() -> None:
    from agilerl.errors import RemoteEnvError, exception_text

    assert str(RemoteEnvError("ws://me:pw@host:1/ws failed")) == "ws://***@host:1/ws failed"
    assert exception_text(ValueError("bad http://me:pw@h")) == "ValueError: bad http://***@h"


def test_an_env_urls_password_is_not_in_evals_label_or_file_name() -> None:
    import argparse

    from agilerl.cli.eval_cmd import _env_spec

    args = argparse.Namespace(env_url=["http://me:PASS-1234@127.0.0.1:9"], source=None, env_config=None, max_turns=None, tool_parser=None)
    spec, _, label = _env_spec(args)
    assert label == "http://***@127.0.0.1:9" and spec.env_urls == ["http://me:PASS-1234@127.0.0.1:9"]
