"""A free TCP port for a server that someone else binds later (a subprocess, a launcher, a process group).

Binding port 0 and closing the socket gives a port that is free *now*, but the server that binds
it seconds later (``vllm serve`` after its imports, torch's TCPStore under ``accelerate launch``,
vLLM's weight-transfer group) may find it taken meanwhile: the kernel hands ports from the same
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) to every other port-0 bind and every
outgoing connection on the machine. A port outside that range is taken only by someone who names
it, so ``free_port`` picks one there, at random so that concurrent pickers (pytest-xdist workers)
seldom pick the same one. Standard library only: ``import agilerl`` stays light.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "ephemeral_range", "candidate_ports"]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_EPHEMERAL_RANGE = (49152, 65535)
"""The range where the kernel's file is missing or unreadable (IANA's dynamic ports; macOS uses it)."""
LOWEST_PORT = 20000
"""Below this sit the well-known and registered ports other services may be configured on."""
TRIES = 64

_random = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """``(first, last)`` of the ports the kernel hands out for port-0 binds and outgoing connections."""
    try:
        first, last = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return IANA_EPHEMERAL_RANGE
    if not 1 <= first <= last <= 65535:
        return IANA_EPHEMERAL_RANGE
    return first, last


def candidate_ports() -> range:
    """The ports ``free_port`` draws from: ``LOWEST_PORT`` up to just below the ephemeral range, else
    the ports above it; empty where neither leaves room."""
    first, last = ephemeral_range()
    if first > LOWEST_PORT:
        return range(LOWEST_PORT, first)
    return range(last + 1, 65536)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on ``host`` and outside the kernel's ephemeral range, so that no port-0 bind
    or outgoing connection is given it before the caller's server binds it. Up to ``TRIES``
    candidates drawn at random are each bound (no ``SO_REUSEADDR``: a port in use or in TIME_WAIT
    fails); if none binds, a port the kernel picks (port 0), as before."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = candidate_ports()
    for port in _random.sample(candidates, min(TRIES, len(candidates))):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
