"""What the background persist's encoding costs the serving event loop: in a thread, one forked child, or two.

One process holds N live Workplace sessions (each after a mutating tool call), captures them as a checkpoint
does, and encodes every frozen record each way, while a coroutine on the event loop asks for a 1 ms sleep
over and over (a stand-in for the requests the server answers meanwhile). Printed per way: the encode's wall
time, the CPU time it cost this process and its children, and the event loop's lag (how late each 1 ms sleep
woke: p50, p99, max). The ways run in the same process, alternately, so a loaded machine slows them alike.

    .venv/bin/python benchmarks/encode_offload.py [--sessions 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.asgi import base_config, serve  # noqa: E402

from gym_services.base.config import load_config  # noqa: E402
from gym_services.control import encoding  # noqa: E402
from gym_services.control.participant import FrozenRecord, Scope  # noqa: E402
from gym_services.resources.workplace_assistant.app import Config, create_app  # noqa: E402


async def lagging(stop: asyncio.Event) -> list[float]:
    lags = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)
    return lags


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def measure(encode, items) -> tuple[float, float, list[float]]:
    stop = asyncio.Event()
    watcher = asyncio.create_task(lagging(stop))
    await asyncio.sleep(0.05)
    t0, c0 = time.perf_counter(), cpu_s()
    await asyncio.to_thread(encode, items)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    stop.set()
    return wall, cpu, await watcher


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="live Workplace sessions (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both ways (default 3)")
    args = parser.parse_args()
    app = create_app(load_config(Config, overrides=base_config("workplace_assistant")))
    async with serve(app) as client:
        for i in range(args.sessions):
            client.cookies.clear()
            ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
            (await client.post("/seed_session", json={}, headers=ident)).raise_for_status()
            body = {"recipient": "nadia.moreau@atlas.com", "subject": f"n{i}", "body": "b"}
            (await client.post("/email_send_email", json=body, headers=ident)).raise_for_status()
        capture = await app.state.participant.capture(Scope.of(None))
        items = [r for r in capture.records if isinstance(r, FrozenRecord)]
        encoder = app.state.participant.encoder
        ways = {
            "thread": lambda xs: [encoding.encode_one(encoder, x) for x in xs],
            "1 child": lambda xs: encoding.encode_frozen(encoder, xs, threading.Event(), processes=1),
            "2 children": lambda xs: encoding.encode_frozen(encoder, xs, threading.Event(), processes=2),
        }
        results: dict[str, list[tuple[float, float, list[float]]]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                results[name].append(await measure(way, items))
    print(
        f"encoding {len(items)} frozen records of {args.sessions} Workplace sessions, {args.rounds} rounds each, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'way':>13} {'encode s (median)':>17} {'CPU s':>6} {'loop lag p50 ms':>15} {'p99 ms':>7} {'max ms':>7}")
    for name, runs in results.items():
        lags = sorted(x for _, _, ls in runs for x in ls)
        p99 = lags[max(0, -(-len(lags) * 99 // 100) - 1)]
        print(
            f"{name:>13} {statistics.median(w for w, _, _ in runs):>17.2f} "
            f"{statistics.median(c for _, c, _ in runs):>6.2f} {statistics.median(lags) * 1e3:>15.2f} "
            f"{p99 * 1e3:>7.2f} {lags[-1] * 1e3:>7.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
