"""What the process takes from its peers (judges, vLLM replicas, OpenAI-compatible endpoints, env
servers) and what it says about them: one rule each, used by every caller.

- ``read_capped``: a reply's body read under a byte cap, refused from its ``Content-Length`` or
  as soon as the chunks pass the cap, so a peer answering 200 MB costs at most the cap.
- ``redact`` (from ``agilerl.errors``, whose errors and warnings all print through it): a URL,
  or any message holding URLs, without its userinfo (``user:password@``), for every URL that
  goes into a message, a log or a printed line.
- ``secret_from_env``: an API key read from an environment variable, checked: surrounding
  whitespace (the trailing newline of ``$(cat keyfile)`` or a mounted secret) is stripped with a
  warning, as ``agilerl serve`` strips its token, because a key never holds any; anything else
  an HTTP header cannot carry is refused naming the variable, before a peer sees it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from agilerl.errors import AgileRLWarning, InvalidArgument, ReplyTooLarge, redact

__all__ = ["DEFAULT_MAX_REPLY_BYTES", "read_capped", "read_capped_text", "redact", "clean_secret", "secret_from_env"]

DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024
"""A generation endpoint's reply (a completion's ids and log-probs) is kilobytes to a few MB."""

async def read_capped(response: Any, cap: int, *, url: str, setting: str) -> bytes:
    """An aiohttp response's body, at most ``cap`` bytes; ``ReplyTooLarge`` naming the URL (its
    userinfo redacted), the cap and ``setting`` (what raises it) otherwise."""
    length = response.content_length
    if length is not None and length > cap:
        raise ReplyTooLarge(_too_large(url, f"a body of {length:,} bytes (Content-Length)", cap, setting))
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > cap:
            raise ReplyTooLarge(_too_large(url, "a body past that", cap, setting))
        chunks.append(chunk)
    return b"".join(chunks)


async def read_capped_text(response: Any, cap: int, *, url: str, setting: str) -> str:
    """``read_capped`` decoded by the response's charset (UTF-8 when it names none)."""
    body = await read_capped(response, cap, url=url, setting=setting)
    return body.decode(response.charset or "utf-8", errors="replace")


def _too_large(url: str, what: str, cap: int, setting: str) -> str:
    return (
        f"{redact(url)} answered with {what}, over the {cap:,} bytes a reply is read up to; "
        f"raise {setting} if its replies are meant to be that large"
    )


def clean_secret(value: str | None, source: str, what: str = "an API key") -> str | None:
    """``value`` with surrounding whitespace stripped (None when unset); ``InvalidArgument`` naming
    ``source`` (``$JUDGE_API_KEY``, ``--api-key``) when it is blank or holds what an HTTP header
    cannot carry."""
    if value is None:
        return None
    cleaned = value.strip()
    if not cleaned:
        raise InvalidArgument(f"{source} is blank; give the real key, or unset it.")
    bad = next((c for c in cleaned if not "!" <= c <= "~"), None)
    if bad is not None:
        raise InvalidArgument(
            f"{source} holds {bad!r} at position {cleaned.index(bad)}: {what} is printable ASCII "
            "without spaces or control characters; set it to the key alone."
        )
    return cleaned


def secret_from_env(variable: str, what: str = "an API key") -> str | None:
    """The key in ``$variable`` (None when unset or empty), checked by ``clean_secret``; a
    trailing newline or other surrounding whitespace is stripped with a warning."""
    raw = os.environ.get(variable)
    if not raw:
        return None
    key = clean_secret(raw, f"${variable}", what)
    if key != raw:
        warnings.warn(
            f"${variable}: stripped the whitespace around {what} (a file's trailing newline?); "
            "it is sent without it",
            AgileRLWarning,
            stacklevel=2,
        )
    return key
