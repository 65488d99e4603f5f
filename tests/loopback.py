"""Hand-written aiohttp servers for tests (a foreign env server, a replica that misbehaves, a
server that publishes odd metadata): an app on a free loopback port, in a loop thread of its own."""

from __future__ import annotations

from typing import Any

from agilerl.concurrency import LoopThread


class LoopbackServer:
    """``app`` served at ``self.url`` (``http://127.0.0.1:PORT``) until ``stop()``."""

    def __init__(self, app: Any, name: str = "loopback-server") -> None:
        self._thread = LoopThread(name)
        self._runner, self.url = self._thread.run(self._start(app))

    @staticmethod
    async def _start(app: Any) -> tuple[Any, str]:
        from aiohttp import web

        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    def stop(self) -> None:
        self._thread.run(self._runner.cleanup())
        self._thread.stop()
