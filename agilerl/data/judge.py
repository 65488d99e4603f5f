"""An LLM judge's endpoint: any OpenAI-compatible ``/chat/completions``, with a cap on calls in
flight, a timeout per call, retries with backoff, a cache, counters and a bounded outage.

``JudgeEndpoint.complete(prompt)`` is the one door; the rubrics built on it (``llm_judge``,
``llm_judge_group`` in ``agilerl.data.judges``) only render prompts and parse scores.

- **Key:** read from the environment variable the manifest names (``api_key_env``), never
  written in a manifest, and never in a message, log, metric or transcript: every error text
  this module builds, and every reply it returns, passes through ``_scrub`` (the test sends a
  sentinel key and greps for it).
  The URL is printed without its userinfo (``user:password@``): ``agilerl.peers.redact``.
- **Reply:** read up to ``max_reply_bytes`` (its ``Content-Length``, else its chunks): a judge
  answering 200 MB costs at most that, and fails the judgement naming the URL and the setting.
- **Cache:** keyed by the model and the rendered prompt, bounded by entries (``cache_size``) and
  by bytes (``cache_bytes``); identical requests in flight share one call. A judge at
  temperature 0 answers a repeated prompt the same way, so a hit is exact.
- **Failures:** a call that still fails after its retries raises ``JudgeFailed`` (the rubric
  scores that sample by its failure policy and counts it); when every call has failed for
  ``give_up_after_s``, the next failure raises ``JudgeUnavailable`` naming the URL: the run stops
  rather than train on a reward that is only the failure score.
- **Counters:** ``judge/calls``, ``judge/failures``, ``judge/cache_hits``, ``judge/latency_s``
  (mean over the calls made), ``judge/tokens``, process-wide, read and reset by ``take_judge_metrics``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from agilerl.concurrency import shared_loop
from agilerl.errors import InvalidArgument, JudgeFailed, JudgeUnavailable, ReplyTooLarge, RubricError
from agilerl.peers import read_capped_text, redact, secret_from_env

if TYPE_CHECKING:
    import aiohttp

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "JudgeEndpoint", "JudgeStats", "JUDGE_STATS", "take_judge_metrics"]

DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024
"""A judgement is a few hundred tokens; a reasoning judge's long one still fits many times over."""

_RETRIED_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class JudgeStats:
    """Counters summed over every judge of the process since the last ``take``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = False  # a judge was built: its metrics are logged every step
        self._reset()

    def _reset(self) -> None:
        self.calls = self.failures = self.cache_hits = self.tokens = 0
        self.latency_s = 0.0

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def take(self) -> dict[str, float]:
        """The counts since the last take (``latency_s``: the mean of the calls made), reset."""
        with self._lock:
            numbers = {
                "calls": float(self.calls),
                "failures": float(self.failures),
                "cache_hits": float(self.cache_hits),
                "latency_s": self.latency_s / self.calls if self.calls else 0.0,
                "tokens": float(self.tokens),
            }
            self._reset()
        return numbers


JUDGE_STATS = JudgeStats()


def take_judge_metrics() -> dict[str, float] | None:
    """``judge/...`` since the last call; None when no judge was built in this process (a run
    without one logs none, a run with one logs every key every step, zeros included)."""
    numbers = JUDGE_STATS.take()
    if not JUDGE_STATS.active:
        return None
    return {f"judge/{name}": value for name, value in numbers.items()}


class JudgeEndpoint:
    """``POST {base_url}/chat/completions`` for judgements (see the module doc)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        give_up_after_s: float = 300.0,
        temperature: float = 0.0,
        max_tokens: int = 256,
        system_prompt: str | None = None,
        extra_body: dict[str, Any] | None = None,
        cache_size: int = 65536,
        cache_bytes: int = 64 * 1024 * 1024,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise RubricError(f"judge base_url must start with http:// or https://, got {redact(base_url)!r}.")
        numbers = {"timeout_s": timeout_s, "backoff_s": backoff_s, "give_up_after_s": give_up_after_s, "temperature": temperature}
        for name, value in numbers.items():  # NaN passes every comparison below
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise RubricError(f"judge {name} must be a finite number, got {value!r}.")
        if max_concurrency < 1 or retries < 0 or timeout_s <= 0 or backoff_s < 0 or give_up_after_s <= 0:
            raise RubricError(
                "judge limits: max_concurrency >= 1, retries >= 0, timeout_s > 0, backoff_s >= 0 and "
                f"give_up_after_s > 0 are needed, got {max_concurrency}, {retries}, {timeout_s}, "
                f"{backoff_s} and {give_up_after_s}."
            )
        for name, value in (("cache_size", cache_size), ("cache_bytes", cache_bytes), ("max_reply_bytes", max_reply_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name.startswith("cache") else 1):
                raise RubricError(f"judge {name} must be a whole number of at least {0 if name.startswith('cache') else 1}, got {value!r}.")
        key = None
        if api_key_env is not None:
            try:
                key = secret_from_env(api_key_env, "the judge's API key")
            except InvalidArgument as exc:
                raise RubricError(f"judge api_key_env: {exc}") from None
            if not key:
                raise RubricError(
                    f"judge api_key_env {api_key_env!r}: that environment variable is not set; "
                    f"export {api_key_env}=... before the run (the manifest names the variable, never the key)."
                )
        JUDGE_STATS.active = True
        self.url = base_url.rstrip("/") + "/chat/completions"  # userinfo kept: aiohttp sends it as basic auth
        self.shown_url = redact(self.url)
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.give_up_after_s = give_up_after_s
        self._secret = key
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._body = {"model": model, "temperature": temperature, "max_tokens": max_tokens, **(extra_body or {})}
        self._system = system_prompt
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._cache_size, self._cache_bytes, self._cached_bytes = cache_size, cache_bytes, 0
        self.max_reply_bytes = max_reply_bytes
        self._in_flight: dict[str, asyncio.Future[str]] = {}
        self._failing_since: float | None = None
        self._loop = shared_loop()
        self._session: aiohttp.ClientSession | None = None
        self._limit: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never the headers
        return f"JudgeEndpoint({self.shown_url!r}, model={self.model!r})"

    async def complete(self, prompt: str) -> str:
        """The judge's reply to ``prompt`` (cached); ``JudgeFailed`` or ``JudgeUnavailable`` else."""
        if not self._loop.on_loop_thread():
            return await self._loop.run_async(self.complete(prompt))
        key = hashlib.sha256(f"{self.model}\0{self._system}\0{prompt}".encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            JUDGE_STATS.add(cache_hits=1)
            return self._cache[key]
        if key in self._in_flight:  # the same prompt is being judged: share that call
            JUDGE_STATS.add(cache_hits=1)
            return await asyncio.shield(self._in_flight[key])
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            reply = await self._call(prompt)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody shared it
            raise
        finally:
            del self._in_flight[key]
        future.set_result(reply)
        self._remember(key, reply)
        return reply

    def _remember(self, key: str, reply: str) -> None:
        """Cache ``reply``, dropping the oldest until both bounds hold (one too big is not kept)."""
        size = len(key) + len(reply.encode())
        if size > self._cache_bytes or self._cache_size < 1:
            return
        self._cache[key] = reply
        self._cached_bytes += size
        while len(self._cache) > self._cache_size or self._cached_bytes > self._cache_bytes:
            old_key, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old_key) + len(old.encode())

    async def _call(self, prompt: str) -> str:
        """One judgement with retries; tracks how long every call has been failing."""
        try:
            reply = await self._attempts(prompt)
        except JudgeFailed as exc:
            JUDGE_STATS.add(failures=1)
            now = time.monotonic()
            self._failing_since = self._failing_since if self._failing_since is not None else now
            if now - self._failing_since >= self.give_up_after_s:
                raise JudgeUnavailable(
                    f"the judge at {self.shown_url} failed every call for {now - self._failing_since:.0f} s "
                    f"(give_up_after_s {self.give_up_after_s:g}); the last: {exc}. Check that it is "
                    "running and reachable, or raise give_up_after_s."
                ) from None
            raise
        self._failing_since = None
        return reply

    async def _attempts(self, prompt: str) -> str:
        import aiohttp

        session, limit = self._open()
        messages = ([{"role": "system", "content": self._system}] if self._system else []) + [
            {"role": "user", "content": prompt}
        ]
        body = {**self._body, "messages": messages}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(30.0, self.backoff_s * 2 ** (attempt - 1)))
            try:
                async with limit:  # the wait for a slot is not the call's: the timeout starts inside
                    t0 = time.perf_counter()
                    async with session.post(self.url, json=body, timeout=timeout) as response:
                        status = response.status
                        text = await read_capped_text(
                            response, self.max_reply_bytes, url=self.url, setting="the judge's max_reply_bytes"
                        )
            except ReplyTooLarge as exc:  # the same prompt gets the same answer: no retry
                JUDGE_STATS.add(calls=1, latency_s=time.perf_counter() - t0)
                why = str(exc)
                break
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                JUDGE_STATS.add(calls=1, latency_s=time.perf_counter() - t0)
                timed_out = isinstance(exc, asyncio.TimeoutError)
                why = f"timed out after {self.timeout_s:g} s" if timed_out else f"{type(exc).__name__}: {exc}"
                continue
            JUDGE_STATS.add(calls=1, latency_s=time.perf_counter() - t0)
            if status == 200:
                return self._reply(text)
            why = f"HTTP {status}: {text.strip()[:200]}"
            if status not in _RETRIED_STATUSES:
                break
        raise JudgeFailed(self._scrub(f"the judge at {self.shown_url} ({self.model}) failed after {attempt + 1} attempt(s): {why}"))

    def _reply(self, text: str) -> str:
        try:
            reply = json.loads(text)
            content = reply["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeFailed(self._scrub(f"the judge at {self.shown_url} answered without choices[0].message.content: {text[:200]!r}")) from None
        usage = reply.get("usage") or {}
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        JUDGE_STATS.add(tokens=int(tokens) if isinstance(tokens, int) else 0)
        return self._scrub(str(content))  # a reply echoing the key carries it nowhere (errors, cache)

    def _open(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """The session and the cap, made on the shared loop at the first call."""
        if self._session is None or self._limit is None:
            import aiohttp

            self._session = aiohttp.ClientSession(headers=self._headers)
            self._limit = asyncio.Semaphore(self.max_concurrency)
            self._loop.at_stop(self._session.close)
        return self._session, self._limit

    def _scrub(self, text: str) -> str:
        """``text`` with the key (should an endpoint echo it) and any URL's userinfo replaced."""
        return redact(text.replace(self._secret, "***") if self._secret else text)

    def close(self) -> None:
        """Close the HTTP session (also done when the process exits)."""
        if self._session is not None:
            session, self._session, self._limit = self._session, None, None
            self._loop.run(session.close())
