"""A port for a server a test starts on 127.0.0.1 when the port must be named before the server binds it (a command
line, a rendered config). Where the launcher can bind first and hand the socket down, it does, and no port is
probed.

A port probed by binding port 0 comes from the kernel's ephemeral range, the range it also gives every outgoing
connection on the machine as its local port; this suite opens thousands, so such a port can be taken between the
probe and the server's bind (``Address already in use``). Ports above that range are given to no connection and
used by nothing else the suite starts (SeaweedFS takes blocks below 32768), so only another explicit bind can take
one: they are drawn at random, so parallel workers rarely draw the same, and checked free when drawn."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from gym_services.stack.objectstore import port_free

#: fewer ports than this above the ephemeral range: use the kernel's own choice
MIN_SPAN = 1000


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(rng: random.Random | None = None) -> int:
    """A port free now on 127.0.0.1, above the ephemeral range where the machine leaves room for it."""
    _, high = ephemeral_range()
    if 65535 - high >= MIN_SPAN:
        draw = rng or random.SystemRandom()
        for _ in range(100):
            port = draw.randrange(high + 1, 65536)
            if port_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
