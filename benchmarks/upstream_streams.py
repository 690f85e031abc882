"""What reading a generation's stream costs the policy model, per chunk: this checkout against an earlier commit, in
one run.

The policy model reads one server-sent-event stream per generation from its inference workers, a chunk per token
(vLLM, the built-in worker), so at thousands of live rollouts its event loop spends most of its time there
(``benchmarks/RESULTS.md``, "4,096 rollouts"). This runs ``--streams`` generations at once through the policy model's
``Upstream.deltas`` (its engine adapter, its HTTP client, its fleet bookkeeping) against a real built-in inference
worker process, as fast as the worker goes, and measures the CPU time of the process reading them (the worker's own
is not counted): CPU microseconds per chunk received.

Each tree runs in a process of its own with the code chosen by ``PYTHONPATH`` (the earlier commit's ``services/``,
``--ref``, default 72f5ffd: streams read with httpx, the fleet's outstanding tokens summed at every stream's start and
end), against one worker process of this checkout; the trees take turns (A B, B A, ...) for ``--rounds`` rounds.
Each figure is the median over the rounds (min-max beside it); ``after / before`` is the ratio of the medians.

    .venv/bin/python benchmarks/upstream_streams.py [--ref 72f5ffd] [--streams 64 512 2048] [--tokens 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the worker's policy the generations ask for (its answers run to ``max_tokens`` or its own end)
MODEL = "ipi-follow"


async def measure(url: str, streams: int, tokens: int) -> dict[str, float]:
    """``streams`` generations at once through ``Upstream.deltas``; this process's CPU seconds and the chunks."""
    from gym_services.models.policy_model.engines import Halt
    from gym_services.models.policy_model.upstream import Upstream, UpstreamConfig

    upstream = Upstream(UpstreamConfig(base_url=f"{url}/v1"))
    await upstream.start()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": tokens}

    async def one() -> int:
        count = 0
        async with contextlib.aclosing(upstream.deltas(upstream.engine.request(chat, None, tokens), Halt())) as ds:
            async for _ in ds:
                count += 1
        return count

    try:
        await asyncio.gather(*(one() for _ in range(min(streams, 64))))  # connections open, code warm
        cpu, wall = time.process_time(), time.monotonic()
        chunks = sum(await asyncio.gather(*(one() for _ in range(streams))))
        return {"chunks": chunks, "cpu_s": time.process_time() - cpu, "wall_s": time.monotonic() - wall}
    finally:
        await upstream.close()


def run_tree(services: Path, url: str, streams: int, tokens: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(services), str(ROOT)])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", url, str(streams), str(tokens)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="72f5ffd", help="the earlier commit (before)")
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--tokens", type=int, default=60, help="max_tokens of each generation")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from benchmarks._serve import start_server
    from benchmarks.cli_checkpoint import extract

    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-upstream-streams-"))
    trees = {"after": ROOT / "services", "before": extract(args.ref, tmp / "before")}
    proc, url = start_server("inference_worker", {}, tmp)
    rows = []
    try:
        for streams in args.streams:
            seen: dict[str, list[float]] = {"after": [], "before": []}
            chunks: dict[str, list[float]] = {"after": [], "before": []}
            for round_ in range(args.rounds):
                order = ["after", "before"] if round_ % 2 == 0 else ["before", "after"]
                for tree in order:
                    got = run_tree(trees[tree], url, streams, args.tokens)
                    seen[tree].append(1e6 * got["cpu_s"] / got["chunks"])
                    chunks[tree].append(got["chunks"])
                    print(f"  {streams} streams, {tree}: {got}", file=sys.stderr, flush=True)
            ratio = statistics.median(seen["after"]) / statistics.median(seen["before"])
            rows.append(
                f"| {streams} | {statistics.median(chunks['after']):.0f} | {spread(seen['before'])} | "
                f"{spread(seen['after'])} | {ratio:.2f} |"
            )
    finally:
        proc.kill()
        proc.wait(timeout=10)
    print(f"before = {args.ref}, after = this checkout; {args.rounds} rounds; CPU of the reading process only")
    print("| streams at once | chunks | before: CPU us per chunk | after: CPU us per chunk | after / before |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--measure":
        print(json.dumps(asyncio.run(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))))
    else:
        main()
