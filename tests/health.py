"""Starting a server on a port of its own and waiting for its ``GET /health``: standard library
only, so the scripts that run in the extra venvs (tests/vllm_vision_check.py) use it too."""

from __future__ import annotations

import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def start_server(
    command: list[str], url_file: Path, log: Path, *, timeout_s: float = 60, **popen: Any
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server that binds a free port itself and writes its URL to ``url_file`` once it
    listens (``agilerl serve --port 0 --port-file``): a port picked here and bound there seconds
    later (after the server's imports) could meanwhile be taken by another process. Returns the
    process and its URL once ``/health`` answers; AssertionError with the log's tail if it exits
    or stays silent for ``timeout_s``."""
    url_file.unlink(missing_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **popen)
    deadline = time.monotonic() + timeout_s
    try:
        while not (url_file.is_file() and (url := url_file.read_text().strip())):
            if proc.poll() is not None:
                raise AssertionError(f"{command[:4]} exited ({proc.returncode}) before it listened")
            if time.monotonic() > deadline:
                raise AssertionError(f"{command[:4]} wrote no URL within {timeout_s:.0f} s")
            time.sleep(0.1)
        wait_healthy(url, max(1.0, deadline - time.monotonic()), alive=lambda: proc.poll() is None, poll_s=0.1)
    except AssertionError as exc:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"{exc}\n{log.read_text(errors='replace')[-3000:]}") from None
    return proc, url


ASGI_ON_A_FREE_PORT = textwrap.dedent('''
    def serve(app, url_file):
        """uvicorn on a port it binds itself, its URL written to url_file once it listens (see
        tests/health.py start_server)."""
        import os, socket, uvicorn
        sock = socket.create_server(("127.0.0.1", 0))
        with open(url_file + ".tmp", "w") as out:
            out.write(f"http://127.0.0.1:{sock.getsockname()[1]}")
        os.replace(url_file + ".tmp", url_file)
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
''')
"""Source for a server script run in another venv (which cannot import this module): defines
``serve(app, url_file)``, for ``start_server``."""
