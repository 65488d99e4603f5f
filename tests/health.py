"""Waiting for a server's ``GET /health``: standard library only, so the scripts that run in the
extra venvs (tests/vllm_vision_check.py) use it too."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable


def wait_healthy(url: str, timeout_s: float, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.5) -> None:
    """Return once ``url``'s ``/health`` answers; AssertionError once ``alive()`` is false (the
    server's process exited) or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            return
        except OSError:
            if not alive():
                raise AssertionError(f"the server at {url} exited before it answered") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"the server at {url} did not answer within {timeout_s:.0f} s") from None
            time.sleep(poll_s)
