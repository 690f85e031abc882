"""Control-plane overhead on data requests: throughput with and without it, side by side.

Starts the example ``counter`` server twice as a real uvicorn process on 127.0.0.1 — once with
checkpointing on (session cookies, admission, fencing, control routes) and once with it off —
and drives ``POST /increment`` from a separate load process with keep-alive connections.
Rounds alternate between the two so machine noise hits both alike. Throughput swings with whatever
else the machine runs; the server's own CPU time per request (user + system, read from
``/proc/<pid>/stat``) does not, so it is printed beside it and its ratio is the figure to compare
between versions on a shared machine.

    .venv/bin/python benchmarks/control_overhead.py [--seconds 3] [--rounds 3] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._serve import start_server  # noqa: E402


def start(enabled: bool, tmp: Path) -> tuple[subprocess.Popen, str]:
    return start_server("counter", {"checkpoint": {"enabled": enabled}}, tmp)


async def load(url: str, seconds: float, connections: int) -> tuple[int, list[float]]:
    """Each connection seeds its own session; then all increment until time is up."""
    latencies: list[float] = []
    count = 0
    seeded = 0
    go = asyncio.Event()
    deadline = 0.0

    async def worker(i: int) -> None:
        nonlocal count, seeded, deadline
        headers = {"x-ng-rollout-id": f"bench-{i}", "x-ng-attempt": "0"}
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            (await client.post("/seed_session", json={"start": 0}, headers=headers)).raise_for_status()
            seeded += 1
            if seeded == connections:
                deadline = time.perf_counter() + seconds
                go.set()
            await go.wait()
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                resp = await client.post("/increment", json={"by": 1}, headers=headers)
                latencies.append(time.perf_counter() - t0)
                assert resp.status_code == 200, resp.text
                count += 1

    await asyncio.gather(*(worker(i) for i in range(connections)))
    return count, latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, seconds: float, connections: int, pid: int) -> tuple[float, float, float]:
    """Requests/s, p50 latency in ms, and the server's CPU microseconds per request."""
    cpu0 = cpu_seconds(pid)
    result = subprocess.run(
        [sys.executable, __file__, "--_load", url, "--seconds", str(seconds), "--connections", str(connections)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"load process failed: {result.stderr[-2000:]}")
    rps, p50 = map(float, result.stdout.split())
    cpu_us = (cpu_seconds(pid) - cpu0) / max(1.0, rps * seconds) * 1e6
    return rps, p50, cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each load run, seconds (default 3)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="load runs per server, the two servers alternating (default 3)"
    )
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections of the load (default 16)")
    parser.add_argument("--_load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._load:
        count, lat = asyncio.run(load(args._load, args.seconds, args.connections))
        print(count / args.seconds, statistics.median(lat) * 1000)
        return
    with tempfile.TemporaryDirectory() as tmp:
        on, on_url = start(True, Path(tmp))
        off, off_url = start(False, Path(tmp))
        try:
            measure(on_url, 0.5, args.connections, on.pid)  # warm-up both
            measure(off_url, 0.5, args.connections, off.pid)
            results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
            for _ in range(args.rounds):
                results[False].append(measure(off_url, args.seconds, args.connections, off.pid))
                results[True].append(measure(on_url, args.seconds, args.connections, on.pid))
        finally:
            on.kill()
            off.kill()

    def med(enabled: bool, i: int) -> float:
        return statistics.median(r[i] for r in results[enabled])

    print(
        f"control-plane overhead: counter /increment, {args.connections} connections, "
        f"{args.rounds} alternating rounds of {args.seconds}s, median of rounds"
    )
    print(f"{'configuration':<32}{'req/s':>10}{'p50 ms':>10}{'server CPU us/req':>20}")
    print(f"{'checkpointing off':<32}{med(False, 0):>10.0f}{med(False, 1):>10.2f}{med(False, 2):>20.0f}")
    print(f"{'checkpointing on (control plane)':<32}{med(True, 0):>10.0f}{med(True, 1):>10.2f}{med(True, 2):>20.0f}")
    ratios = f"{med(True, 0) / med(False, 0):>10.3f}{'':>10}{med(False, 2) / med(True, 2):>20.3f}"
    print(f"{'ratio on/off (target >= 0.97)':<32}{ratios}")
    print("(the CPU ratio is off/on, so like throughput 1.0 means no overhead; it holds on a busy machine)")


if __name__ == "__main__":
    main()
