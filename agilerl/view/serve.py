"""``agilerl view --serve``: the same page from a loopback HTTP server (the standard library's),
which reads what the run appended whenever the page asks (every 2 s), and a step's records whole.

Routes: ``/`` the page; ``api/poll?since=[[metrics rows, records], ...]`` what each run gained
past what the page holds; ``api/step?run=R&step=S`` one step's records and pictures.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from agilerl.view.page import PAGE_BUDGET, page_data, render_page, step_data, step_summary
from agilerl.view.sources import Source

__all__ = ["ViewServer"]


class ViewServer:
    """The page of ``sources`` on ``http://127.0.0.1:port`` (0: a free port), in a thread of its own."""

    def __init__(self, sources: Sequence[Source], *, title: str, port: int = 0, budget: int = PAGE_BUDGET) -> None:
        self.sources, self.title, self.budget = list(sources), title, budget
        self._lock = threading.Lock()  # one reader of the files at a time
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread: threading.Thread | None = None

    def start(self) -> ViewServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="agilerl-view", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def page(self) -> str:
        with self._lock:
            for source in self.sources:
                source.refresh()
            return render_page(page_data(self.sources, budget=self.budget, live=True), title=self.title)

    def poll(self, since: list[Any]) -> dict[str, Any]:
        """Each run's metrics rows past the page's count (all, with ``reset``, when the file was
        cut back by a resume), its record count and its steps."""
        out = []
        with self._lock:
            for index, source in enumerate(self.sources):
                source.refresh()
                rows, records = (since[index] if index < len(since) and isinstance(since[index], list) else [0, 0])[:2]
                rows = rows if isinstance(rows, int) and rows >= 0 else 0
                records = records if isinstance(records, int) and records >= 0 else 0
                reset = rows > len(source.metrics) or records > len(source.entries)
                out.append({
                    "reset": reset,
                    "metrics": source.metrics if reset else source.metrics[rows:],
                    "total": len(source.entries),
                    "steps": step_summary(source.entries),
                })
        return {"runs": out}

    def step(self, run: int, step: int) -> dict[str, Any] | None:
        if not 0 <= run < len(self.sources):
            return None
        with self._lock:
            return step_data(self.sources[run], step)


def _handler(server: ViewServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/":
                    self._send(200, server.page().encode(), "text/html; charset=utf-8")
                elif url.path == "/api/poll":
                    since = json.loads(query.get("since", "[]"))
                    self._json(server.poll(since if isinstance(since, list) else []))
                elif url.path == "/api/step":
                    reply = server.step(int(query.get("run", "-1")), int(query.get("step", "0")))
                    self._json(reply) if reply is not None else self._send(404, b"no such run", "text/plain")
                else:
                    self._send(404, b"not found", "text/plain")
            except ValueError as exc:
                self._send(400, f"bad request: {exc}".encode(), "text/plain")

        def _json(self, value: Any) -> None:
            self._send(200, json.dumps(value, allow_nan=False).encode(), "application/json")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the page polls every 2 s
            pass

    return Handler
