"""A replica's ``GET /health`` and ``GET /metadata``, synchronous and bounded (any provider's)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["healthy", "metadata_of", "wait_healthy"]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Replicas are reached directly: an ``http_proxy`` in the environment must not sit in between."""


def _http(url: str) -> str:
    """``ws://h:p`` (a replica's URL) as ``http://h:p``."""
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws):]
    return url


def healthy(url: str, timeout_s: float = 5.0) -> bool:
    """Whether the server at ``url`` answers ``GET /health`` with 200 within ``timeout_s``."""
    try:
        with _OPENER.open(_http(url).rstrip("/") + "/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def wait_healthy(url: str, timeout_s: float) -> None:
    """Return once ``url`` is healthy; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    delay = 0.02
    while not healthy(url, timeout_s=max(0.1, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() + delay > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def metadata_of(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``/metadata`` ({} when it cannot be read)."""
    try:
        with _OPENER.open(_http(url).rstrip("/") + "/metadata", timeout=timeout_s) as resp:
            body = json.loads(resp.read(4 * 1024 * 1024))
    except (OSError, urllib.error.URLError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
