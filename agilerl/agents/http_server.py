"""A small threaded HTTP/1.1 server on loopback: one thread per connection, the handler called
on that thread, the response sent in one write.

Why not aiohttp, as agilerl's other servers: the agent endpoint's handler blocks on generation.
On an event loop each call crosses two threads (onto a generating thread and back onto the loop,
which wakes cold after a whole generate call), and aiohttp's own per-request work comes on top:
together 0.6 ms of the tiny model's 16 ms call (``bench/agent_calls.py``). Here the thread that
read the request generates and answers, and the endpoint still answers other connections (401,
429, ``/v1/models``) while a batch generates.

What it speaks: HTTP/1.0 and 1.1, keep-alive, ``Content-Length`` or chunked request bodies,
``Expect: 100-continue``. What it bounds: the request line and headers (431), the body (413,
then the connection closes), the open connections (503), and how long a connection may sit idle,
between requests or within one (``timeout_s``, as aiohttp's keep-alive 75 s).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import IO

__all__ = ["HTTPServer", "Request", "Response"]

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024
"""Bytes in the request line or one header line."""
MAX_HEADERS = 100
_DECIMAL = re.compile(r"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
"""What Content-Length and a chunk size may be (Python's int() would also take '+5', '1_0', '0x5', '²')."""


@dataclass
class Request:
    method: str
    path: str  # without the query
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, payload: object, status: int = 200) -> Response:
        return cls(status, json.dumps(payload).encode())


class _Refused(Exception):
    """The request cannot be read: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPServer:
    """``handler(request) -> Response`` served on ``127.0.0.1:port`` (``port`` 0: a free one, then
    in ``self.port``) from the moment it is built until ``close()``."""

    def __init__(
        self,
        handler: Callable[[Request], Response],
        *,
        name: str,
        max_body_bytes: int,
        port: int = 0,
        max_connections: int = 1024,
        timeout_s: float = 75.0,
    ) -> None:
        self.handler = handler
        self.name = name
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._listener = socket.create_server(("127.0.0.1", port), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True)
        self._accepting.start()

    def close(self) -> None:
        """Stop accepting and end every open connection (idempotent). A handler still running
        (a batch generating) finishes on its own thread; its answer has nowhere to go."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = tuple(self._connections)
        try:  # wakes the accepting thread, which then sees the server closed
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self._accepting.join(timeout=5)
        self._listener.close()
        for connection in connections:  # its own thread closes it: a descriptor closed here could be reused under it
            try:
                connection.shutdown(socket.SHUT_RDWR)  # wakes that thread, blocked reading it
            except OSError:  # it has ended already
                pass

    # -- connections ------------------------------------------------------------------------------

    def _accept(self) -> None:
        count = 0
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.01)  # a connection reset before it was accepted, or out of descriptors: go on
                continue
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                full = len(self._connections) >= self.max_connections
                if not full:
                    self._connections.add(connection)
            if full:
                connection.settimeout(1)
                _send(connection, _plain(503, f"{self.max_connections} connections are open (the most this endpoint "
                                              "serves at once); retry later"))
                _shut(connection)
                continue
            count += 1
            try:
                threading.Thread(target=self._serve, args=(connection,), name=f"{self.name}-{count}", daemon=True).start()
            except RuntimeError:  # no thread to be had (the process's limit): this connection only
                with self._lock:
                    self._connections.discard(connection)
                _shut(connection)

    def _serve(self, connection: socket.socket) -> None:
        reader: IO[bytes] | None = None
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.settimeout(self.timeout_s)
            reader = connection.makefile("rb")
            while not self._closed:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    return  # the client closed it
                try:
                    request, persist = self._read(line, reader, connection)
                except _Refused as exc:
                    if _send(connection, _plain(exc.status, str(exc))):
                        _linger(connection)
                    return
                if request is None:
                    return  # closed mid-request
                try:
                    response = self.handler(request)
                except Exception as exc:  # noqa: BLE001 - the handler's own errors are its to answer
                    log.warning("%s: the handler failed on %s %s", self.name, request.method, request.path, exc_info=True)
                    response = Response.json({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}}, 500)
                if not _send(connection, _head(response, persist) + response.body) or persist == "close":
                    return
        except (OSError, ValueError):  # reset, timed out, or shut by close()
            return
        finally:
            with self._lock:
                self._connections.discard(connection)
            if reader is not None:
                reader.close()
            _shut(connection)

    def _read(self, line: bytes, reader: IO[bytes], connection: socket.socket) -> tuple[Request | None, str | None]:
        """One request after its first line: (the request, None if the client closed it midway;
        the response's ``Connection`` header: None, HTTP/1.1's default keep-alive, or "close" or
        "keep-alive")."""
        if len(line) > MAX_LINE:
            raise _Refused(431, f"the request line is longer than {MAX_LINE} bytes")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[1]:
            raise _Refused(400, "a request line is 'METHOD target HTTP/1.1'")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Refused(505, f"{version[:20]!r}: this server speaks HTTP/1.0 and HTTP/1.1")
        headers = self._headers(reader)
        if headers is None:
            return None, "close"
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        if version == "HTTP/1.1":
            persist = "close" if "close" in tokens else None
        else:
            persist = "keep-alive" if "keep-alive" in tokens else "close"
        body = self._body(headers, reader, connection, expects_continue=version == "HTTP/1.1")
        if body is None:
            return None, "close"
        path = target.split("?", 1)[0]
        if not path.startswith("/"):  # absolute-form, as a proxy would send it
            path = "/" + path.split("://", 1)[-1].partition("/")[2]
        return Request(method, path, headers, body), persist

    @staticmethod
    def _headers(reader: IO[bytes]) -> dict[str, str] | None:
        """The header lines, up to the blank line: at once when they are buffered whole (a
        client's request arrives in one piece), else line by line."""
        buffered = reader.peek(0)  # type: ignore[attr-defined]
        if buffered.startswith(b"\r\n"):  # no headers at all
            reader.read(2)
            return {}
        end = buffered.find(b"\r\n\r\n", 0, MAX_HEADERS * MAX_LINE)
        if end >= 0 and b"\n" not in buffered[:end].replace(b"\r\n", b""):
            lines = buffered[:end].split(b"\r\n")
            reader.read(end + 4)
            if len(lines) > MAX_HEADERS:
                raise _Refused(431, f"more than {MAX_HEADERS} headers")
        else:
            lines = []
            while True:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    return None
                if line in (b"\r\n", b"\n"):
                    break
                if len(lines) == MAX_HEADERS:
                    raise _Refused(431, f"more than {MAX_HEADERS} headers")
                lines.append(line.rstrip(b"\r\n") if len(line) <= MAX_LINE else line)
        headers: dict[str, str] = {}
        for line in lines:
            if len(line) > MAX_LINE:
                raise _Refused(431, f"a header line is longer than {MAX_LINE} bytes")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip():
                raise _Refused(400, f"malformed header line {line[:80]!r}")
            name, value = name.lower(), value.strip()
            if name in headers:
                if name in ("content-length", "transfer-encoding") and headers[name] != value:
                    raise _Refused(400, f"two different {name} headers")
                value = headers[name] if name == "content-length" else f"{headers[name]}, {value}"
            headers[name] = value
        return headers

    def _body(
        self, headers: dict[str, str], reader: IO[bytes], connection: socket.socket, *, expects_continue: bool
    ) -> bytes | None:
        chunked = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if chunked is not None:
            if length is not None:
                raise _Refused(400, "both Content-Length and Transfer-Encoding")
            if chunked.lower() != "chunked":
                raise _Refused(501, f"Transfer-Encoding {chunked[:40]!r}: only chunked is read")
        elif length is None:
            return b""
        elif not _DECIMAL.fullmatch(length):
            raise _Refused(400, f"Content-Length {length[:40]!r} is not a byte count")
        elif int(length) > self.max_body_bytes:
            raise _Refused(413, f"the body ({length} bytes) is larger than max_request_bytes {self.max_body_bytes}")
        if expects_continue and headers.get("expect", "").lower() == "100-continue":
            connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length is None:
            return self._chunks(reader)
        size = int(length)
        body = reader.read(size)
        return body if len(body) == size else None

    def _chunks(self, reader: IO[bytes]) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            line = reader.readline(MAX_LINE + 1)
            if not line:
                return None
            digits = line.split(b";", 1)[0].strip()
            if not _HEX.fullmatch(digits):
                raise _Refused(400, f"malformed chunk size line {line[:40]!r}")
            size = int(digits, 16)
            if size == 0:
                break
            total += size
            if total > self.max_body_bytes:
                raise _Refused(413, f"the chunked body is larger than max_request_bytes {self.max_body_bytes}")
            data = reader.read(size + 2)
            if len(data) < size + 2:
                return None
            if data[-2:] != b"\r\n":
                raise _Refused(400, "a chunk does not end with CRLF")
            parts.append(data[:-2])
        for _ in range(MAX_HEADERS + 1):  # trailers, read and ignored
            line = reader.readline(MAX_LINE + 1)
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                return b"".join(parts)
        raise _Refused(431, f"more than {MAX_HEADERS} trailer lines")


def _head(response: Response, persist: str | None) -> bytes:
    """The status line and headers (as few as a client needs: it parses each, on every call)."""
    head = (
        f"HTTP/1.1 {response.status} {_phrase(response.status)}\r\n"
        f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
    )
    if persist is not None:
        head += f"Connection: {persist}\r\n"
    for name, value in response.headers.items():
        head += f"{name}: {value}\r\n"
    return (head + "\r\n").encode("latin-1")


def _plain(status: int, message: str) -> bytes:
    """An error answer that closes the connection."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    response = Response.json({"error": {"message": message, "type": kind}}, status)
    return _head(response, "close") + response.body


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _send(connection: socket.socket, data: bytes) -> bool:
    try:
        connection.sendall(data)
        return True
    except OSError:  # the client went away
        return False


def _linger(connection: socket.socket, timeout_s: float = 1.0, most_bytes: int = 64 * 1024 * 1024) -> None:
    """After an error answer to a request not read whole: read what the client still sends
    (bounded), so closing does not reset the connection before the client reads the answer."""
    try:
        connection.shutdown(socket.SHUT_WR)
        connection.settimeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        while most_bytes > 0 and time.monotonic() < deadline:
            data = connection.recv(65536)
            if not data:
                return
            most_bytes -= len(data)
    except OSError:
        pass


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
    except OSError:
        pass
    connection.close()
