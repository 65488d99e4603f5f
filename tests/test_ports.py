"""agilerl.ports.free_port: a port free now, outside the kernel's ephemeral range, so that no port-0
bind or outgoing connection is given it before the server it is meant for binds it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from agilerl import ports
from agilerl.ports import free_port

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextmanager
def _held(*ports_: int) -> Iterator[None]:
    with ExitStack() as stack:
        for port in ports_:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", port))
            s.listen()
        yield


def _window(size: int) -> list[int]:
    """``size`` consecutive ports below the ephemeral range that are free now."""
    first, _ = ports.ephemeral_range()
    for start in range(ports.LOWEST_PORT + 1000, first - size, size):
        window = list(range(start, start + size))
        if all(_bindable(p) for p in window):
            return window
    raise AssertionError(f"no {size} free consecutive ports below the ephemeral range")


def test_the_port_is_outside_the_kernels_range_and_binds_at_once() -> None:
    if RANGE_FILE.exists():
        first, last = (int(v) for v in RANGE_FILE.read_text().split())
        assert ports.ephemeral_range() == (first, last)
    first, last = ports.ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not first <= port <= last
        assert port >= ports.LOWEST_PORT
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: really free
            s.listen()


def test_a_held_port_is_never_returned_and_all_held_falls_back_to_a_bindable_one(monkeypatch) -> None:
    held, other = _window(2)
    monkeypatch.setattr(ports, "candidate_ports", lambda: range(held, other + 1))
    with _held(held):
        assert {free_port() for _ in range(20)} == {other}
    with _held(held, other):
        port = free_port()  # both candidates taken: a port the kernel picks
        assert port not in (held, other)
        assert _bindable(port)


def test_a_missing_or_unreadable_range_file_means_ianas_range(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == (49152, 65535)
    assert ports.candidate_ports() == range(ports.LOWEST_PORT, 49152)
    assert ports.LOWEST_PORT <= free_port() < 49152
    garbled = tmp_path / "garbled"
    garbled.write_text("32768\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", garbled)
    assert ports.ephemeral_range() == (49152, 65535)


@pytest.mark.parametrize(
    "kernel, candidates",
    [
        ("32768\t60999\n", range(20000, 32768)),
        ("1024\t40000\n", range(40001, 65536)),  # no room below: the ports above
        ("1024\t65535\n", range(0)),  # no room at all
    ],
)
def test_candidates_lie_below_the_range_else_above_it(monkeypatch, tmp_path, kernel, candidates) -> None:
    (tmp_path / "range").write_text(kernel)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    assert ports.candidate_ports() == candidates


def test_with_no_candidates_the_kernel_picks(monkeypatch, tmp_path) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    assert _bindable(free_port())
