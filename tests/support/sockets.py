"""Which TCP addresses a process listens on, read from /proc (Linux), for "bound to loopback only" tests."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _decode(hex_addr: str, v6: bool) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if v6:
        # four little-endian 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        address = str(ipaddress.IPv6Address(raw))
    else:
        address = str(ipaddress.IPv4Address(raw[::-1]))
    return address, int(port, 16)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that ``pid`` holds ('0.0.0.0'/'::' = all)."""
    inodes = _socket_inodes(pid)
    found = set()
    for table, v6 in (("tcp", False), ("tcp6", True)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(_decode(fields[1], v6))
    return found


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one (to prove a port is not reachable there)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if is_loopback(address) or address == "0.0.0.0" else address


def refused(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when nothing accepts a TCP connection at address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return False
    except OSError:
        return True
