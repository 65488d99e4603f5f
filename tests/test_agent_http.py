"""The agent endpoint's HTTP/1.1 server (agilerl/agents/http_server.py), spoken to over real
loopback sockets byte by byte: what a client may send, and what the server bounds."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from agilerl.agents.endpoint import AgentEndpoint
from agilerl.agents.http_server import HTTPServer, Request, Response


def _echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("the handler broke")
    return Response.json({"method": request.method, "path": request.path, "body": request.body.decode(),
                          "key": request.headers.get("x-key")})


@pytest.fixture
def server():
    server = HTTPServer(_echo, name="test-http", max_body_bytes=1024)
    yield server
    server.close()


def _connect(server: HTTPServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off ``sock`` (``buffer`` keeps what came after it)."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        assert data, f"the server closed the connection mid-response: {bytes(buffer)!r}"
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        data = sock.recv(65536)
        assert data
        rest += data
    buffer[:] = rest[length:]
    return int(status_line.split()[1]), headers, rest[:length]


def _closed(sock: socket.socket, within_s: float = 5.0) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_one_connection_serves_requests_in_turn_and_pipelined(server):
    sock, buffer = _connect(server), bytearray()
    for body in (b'{"a": 1}', b"second"):
        sock.sendall(b"POST /x?q=1 HTTP/1.1\r\nHost: h\r\nX-Key: k\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        status, headers, payload = _response(sock, buffer)
        assert status == 200 and "connection" not in headers  # HTTP/1.1 keeps it open by default
        assert json.loads(payload) == {"method": "POST", "path": "/x", "body": body.decode(), "key": "k"}
    # two requests in one write, the second without a body; a bare-LF client too
    sock.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\nHost: h\n\n")
    assert json.loads(_response(sock, buffer)[2])["body"] == "hi"
    assert json.loads(_response(sock, buffer)[2]) == {"method": "GET", "path": "/b", "body": "", "key": None}
    sock.sendall(b"GET http://127.0.0.1/abs/form HTTP/1.1\r\nConnection: close\r\n\r\n")
    status, headers, payload = _response(sock, buffer)
    assert json.loads(payload)["path"] == "/abs/form" and headers["connection"] == "close"
    assert _closed(sock)


def test_http_1_0_closes_unless_asked_to_keep_alive(server):
    sock, buffer = _connect(server), bytearray()
    sock.sendall(b"GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert _response(sock, buffer)[1]["connection"] == "keep-alive"
    sock.sendall(b"GET /c HTTP/1.0\r\n\r\n")
    status, headers, _ = _response(sock, buffer)
    assert status == 200 and headers["connection"] == "close" and _closed(sock)


def test_chunked_bodies_and_expect_100_continue_are_read(server):
    sock, buffer = _connect(server), bytearray()
    sock.sendall(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n")
    assert json.loads(_response(sock, buffer)[2])["body"] == "hello world"
    sock.sendall(b"POST /e HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert _response(sock, buffer)[0] == 100  # the client may send its body now
    sock.sendall(b"body")
    assert json.loads(_response(sock, buffer)[2])["body"] == "body"


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /big HTTP/1.1\r\nContent-Length: 4000000\r\n\r\n" + b"x" * 4_000_000, 413),  # more than buffers hold
    (b"POST /big HTTP/1.1\r\nContent-Length: 2048\r\nExpect: 100-continue\r\n\r\n", 413),  # no 100 first
    (b"POST /big HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n1\r\nx\r\n0\r\n\r\n", 413),
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nX-Long: " + b"x" * 20000 + b"\r\n\r\n", 431),
    (b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
    ("POST / HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"), 400),  # a digit to str.isdigit
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
])
def test_what_cannot_be_read_gets_its_status_with_a_reason_then_the_connection_closes(server, request_bytes, status):
    sock, buffer = _connect(server), bytearray()
    sock.sendall(request_bytes)  # whole, before reading: the answer must survive the close (no reset)
    got, headers, payload = _response(sock, buffer)
    assert got == status and headers["connection"] == "close"
    assert json.loads(payload)["error"]["message"]
    assert _closed(sock)


def test_a_handler_error_is_a_500_and_the_connection_goes_on(server):
    sock, buffer = _connect(server), bytearray()
    sock.sendall(b"GET /boom HTTP/1.1\r\n\r\nGET /fine HTTP/1.1\r\n\r\n")
    status, _, payload = _response(sock, buffer)
    assert status == 500 and "the handler broke" in json.loads(payload)["error"]["message"]
    assert _response(sock, buffer)[0] == 200


def test_connections_past_the_bound_get_503_and_idle_ones_are_closed():
    server = HTTPServer(_echo, name="test-http", max_body_bytes=1024, max_connections=1, timeout_s=0.5)
    try:
        first = _connect(server)
        first.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert _response(first, bytearray())[0] == 200  # served: the connection is open and counted
        second = _connect(server)
        status, _, payload = _response(second, bytearray())
        assert status == 503 and "1 connections are open" in json.loads(payload)["error"]["message"]
        assert _closed(first)  # idle past timeout_s, well before this client's own 5 s wait
        deadline = time.monotonic() + 5
        while True:  # its place is free again
            third = _connect(server)
            third.sendall(b"GET / HTTP/1.1\r\n\r\n")
            status = _response(third, bytearray())[0]
            if status == 200 or time.monotonic() > deadline:
                break
        assert status == 200
    finally:
        server.close()


def test_close_ends_open_connections_and_a_handler_still_running_finishes():
    entered, release = threading.Event(), threading.Event()

    def slow(request: Request) -> Response:
        entered.set()
        release.wait(10)
        return Response.json({})

    server = HTTPServer(slow, name="test-http", max_body_bytes=1024)
    idle, busy = _connect(server), _connect(server)
    busy.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert entered.wait(10)
    start = time.monotonic()
    server.close()
    assert time.monotonic() - start < 8  # it does not wait for the handler (held 10 s)
    assert _closed(idle, 3) and _closed(busy, 3)
    release.set()
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    server.close()  # idempotent


def test_a_connection_closed_before_its_thread_runs_leaves_that_thread_nothing_to_trip_on():
    """close() only shuts connections and each thread closes its own, so a thread that starts
    after close() (CI saw one) finds its descriptor still there, never gone nor reused."""
    server, gate = HTTPServer(_echo, name="test-http", max_body_bytes=1024), threading.Event()
    started, ended, raised = threading.Semaphore(0), threading.Semaphore(0), []
    serve = server._serve  # the one hook there is: each connection's thread runs after close()

    def after_close(connection: socket.socket) -> None:
        started.release()  # accepted, its thread started, not yet run
        gate.wait(10)
        try:
            serve(connection)
        except BaseException as exc:  # noqa: BLE001 - what the thread would die of
            raised.append(exc)
        finally:
            ended.release()

    server._serve = after_close
    clients = [_connect(server) for _ in range(3)]
    assert all(started.acquire(timeout=10) for _ in clients)
    server.close()
    gate.set()
    assert all(_closed(client, 5) for client in clients)
    assert all(ended.acquire(timeout=10) for _ in clients)
    assert raised == []


def test_the_endpoint_names_its_routes_and_methods(chatml_tokenizer):
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        port = int(endpoint.base_url.rsplit(":", 1)[1].split("/")[0])
        sock, buffer = socket.create_connection(("127.0.0.1", port), timeout=10), bytearray()
        sock.sendall(b"GET /v1/nothing HTTP/1.1\r\n\r\n")
        status, _, payload = _response(sock, buffer)
        assert status == 404 and "/v1/chat/completions" in json.loads(payload)["error"]["message"]
        sock.sendall(b"GET /v1/chat/completions HTTP/1.1\r\n\r\n")
        status, headers, payload = _response(sock, buffer)
        assert status == 405 and headers["allow"] == "POST" and "takes POST" in json.loads(payload)["error"]["message"]
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 2\r\n\r\n{}")
        assert _response(sock, buffer)[0] == 401
    finally:
        endpoint.close()
