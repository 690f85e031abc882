"""Control-plane overhead on data requests: throughput with and without it, side by side.

Starts the example ``counter`` server twice as a real uvicorn process on 127.0.0.1 — once with
checkpointing on (session cookies, admission, fencing, control routes) and once with it off —
and drives ``POST /increment`` from a separate load process with keep-alive connections.
Rounds alternate between the two so machine noise hits both alike.

    .venv/bin/python benchmarks/control_overhead.py [--seconds 3] [--rounds 3] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
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


def measure(url: str, seconds: float, connections: int) -> tuple[float, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--_load", url, "--seconds", str(seconds), "--connections", str(connections)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"load process failed: {result.stderr[-2000:]}")
    rps, p50 = map(float, result.stdout.split())
    return rps, p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
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
            measure(on_url, 0.5, args.connections)  # warm-up both
            measure(off_url, 0.5, args.connections)
            results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(args.rounds):
                results[False].append(measure(off_url, args.seconds, args.connections))
                results[True].append(measure(on_url, args.seconds, args.connections))
        finally:
            on.kill()
            off.kill()
    off_rps = statistics.median(r for r, _ in results[False])
    on_rps = statistics.median(r for r, _ in results[True])
    print(f"control-plane overhead: counter /increment, {args.connections} connections, "
          f"{args.rounds} alternating rounds of {args.seconds}s, median of rounds")
    print(f"{'configuration':<32}{'req/s':>10}{'p50 ms':>10}")
    print(f"{'checkpointing off':<32}{off_rps:>10.0f}{statistics.median(p for _, p in results[False]):>10.2f}")
    print(f"{'checkpointing on (control plane)':<32}{on_rps:>10.0f}{statistics.median(p for _, p in results[True]):>10.2f}")
    print(f"{'ratio on/off (target >= 0.97)':<32}{on_rps / off_rps:>10.3f}")


if __name__ == "__main__":
    main()
