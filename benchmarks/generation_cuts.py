"""Generation work saved by generation cuts, next to a restart-from-boundary baseline, in one run.

Real processes on 127.0.0.1: one paced inference worker (the vLLM stand-in, which counts every token
it generates) and policy model processes in front of it. N episodes each start a generation (first
turns of the shipped Workplace, IPI, Lean and blackjack tasks, round robin), staggered so the cuts
land at different token positions. Then:

- generation cuts: prepare (cuts every in-flight generation at a token boundary) -> capture, persist to a
  file:// location -> SIGKILL the model -> fresh model process -> restore -> resume -> each episode
  re-issues its generation as attempt + 1, which continues from the restored prefix;
- baseline: the same episodes, SIGKILL the model at the same moment without a checkpoint -> fresh
  model -> each episode re-issues its generation from its boundary and it is generated from scratch.

Both re-issued results are checked against an uninterrupted run of the same requests.

    .venv/bin/python benchmarks/generation_cuts.py [--episodes 20] [--tokens-per-second 40] [--cut-after 0.45]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._serve import TOKEN, kill  # noqa: E402
from benchmarks._serve import start_server as start  # noqa: E402

from gym_services.control.protocol import CONTROL_PREFIX as CONTROL  # noqa: E402
from gym_services.models.inference_worker.policies.base import load_tasks  # noqa: E402


def requests(n: int) -> list[dict[str, Any]]:
    pool: list[dict[str, Any]] = []
    for task in load_tasks("workplace_assistant"):
        pool.append({**task["responses_create_params"], "model": "workplace-oracle"})
    for task in load_tasks("indirect_prompt_injection"):
        pool.append({**task["responses_create_params"], "model": "ipi-safe"})
    for task in load_tasks("math_formal_lean"):
        pool.append({**task["responses_create_params"], "model": "lean-refine"})
    for i, task in enumerate(load_tasks("blackjack")):
        hand = [
            "[10, 6] = 16\nDealer shows: 9",
            "[A, 7] = 18\nDealer shows: 10",
            "[9, 3] = 12\nDealer shows: 5",
            "[5, 4] = 9\nDealer shows: 2",
            "[K, 8] = 18\nDealer shows: A",
        ][i % 5]
        observation = {
            "role": "user",
            "content": f"Your hand: {hand}\nRespond with <action>hit</action> or <action>stand</action>.",
        }
        pool.append(
            {
                **task["responses_create_params"],
                "input": [*task["responses_create_params"]["input"], observation],
                "model": "blackjack-basic",
            }
        )
    order = [pool[(i % 4) * 5 + (i // 4) % 5] for i in range(len(pool))]  # round robin over environments
    return [order[i % len(order)] for i in range(n)]


async def worker_tokens(client: httpx.AsyncClient, worker: str) -> int:
    return (await client.get(f"{worker}/stats")).json()["tokens_generated"]


async def control(
    client: httpx.AsyncClient, model: str, verb: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    if verb == "status":
        resp = await client.get(f"{model}{CONTROL}/status", headers=headers)
    else:
        resp = await client.post(f"{model}{CONTROL}/{verb}", json=body or {}, headers=headers)
    resp.raise_for_status()
    return resp.json()


async def call(
    client: httpx.AsyncClient, model: str, body: dict[str, Any], rollout: str, attempt: int, delay: float = 0.0
) -> dict[str, Any] | None:
    await asyncio.sleep(delay)
    headers = {"x-ng-rollout-id": rollout, "x-ng-attempt": str(attempt)}
    try:
        resp = await client.post(f"{model}/v1/responses", json=body, headers=headers, timeout=120)
    except httpx.HTTPError:
        return None  # the model process was killed under this call
    return resp.json() if resp.status_code == 200 else None


@dataclass
class Outcome:
    name: str
    before: int
    after: int
    uninterrupted: int
    in_flight: int
    identical: int
    reused: int
    pause_s: float | None = None
    restore_s: float | None = None

    @property
    def regenerated(self) -> int:
        return self.before + self.after - self.uninterrupted


async def run_phase(
    name: str, bodies: list[dict], expected: list[dict], worker: str, tmp: Path, args, checkpoint: bool
) -> Outcome:
    model_config = {"upstream": {"base_url": f"{worker}/v1"}}
    proc, model = start("policy_model", model_config, tmp)
    rollouts = [f"{name}-{i}" for i in range(len(bodies))]
    spread = args.cut_after * 0.6
    async with httpx.AsyncClient(timeout=60) as client:
        start_tokens = await worker_tokens(client, worker)
        calls = [
            asyncio.create_task(call(client, model, b, r, 0, delay=spread * i / len(bodies)))
            for i, (b, r) in enumerate(zip(bodies, rollouts, strict=True))
        ]
        await asyncio.sleep(args.cut_after)
        pause_s = None
        committed = None
        if checkpoint:
            t0 = time.perf_counter()
            prepared = await control(
                client, model, "prepare", {"checkpoint_id": f"ck-{name}", "deadline_s": 10, "lease_s": 60}
            )
            assert prepared["status"] == "prepared", prepared
            location = f"file://{tmp / 'store'}"
            await control(
                client, model, "capture", {"checkpoint_id": f"ck-{name}", "location": location, "episodes": rollouts}
            )
            committed = await control(client, model, "persist", {"checkpoint_id": f"ck-{name}"})
            pause_s = time.perf_counter() - t0
            in_flight = (await control(client, model, "status"))["live"]
            in_flight_count = in_flight["cut"] + in_flight["held"]
        else:
            in_flight_count = sum(1 for c in calls if not c.done())
        kill(proc)
        await asyncio.gather(*calls)
        await asyncio.sleep(0.3)  # let the worker notice the closed streams
        before = await worker_tokens(client, worker) - start_tokens

        proc, model = start("policy_model", model_config, tmp)
        restore_s = None
        if checkpoint:
            assert committed is not None
            t0 = time.perf_counter()
            await control(
                client,
                model,
                "restore",
                {
                    "checkpoint_id": f"ck-{name}",
                    "location": f"file://{tmp / 'store'}",
                    "manifest_key": committed["manifest_key"],
                    "manifest_sha256": committed["manifest_sha256"],
                    "lease_s": 60,
                },
            )
            await control(client, model, "resume", {"checkpoint_id": f"ck-{name}"})
            restore_s = time.perf_counter() - t0
        mark = await worker_tokens(client, worker)
        results = await asyncio.gather(*(call(client, model, b, r, 1) for b, r in zip(bodies, rollouts, strict=True)))
        after = await worker_tokens(client, worker) - mark
        reused = (await control(client, model, "status"))["live"]["tokens_reused"]
    kill(proc)
    identical = sum(1 for got, want in zip(results, expected, strict=True) if got == want)
    total = sum(r["usage"]["output_tokens"] for r in expected)
    return Outcome(name, before, after, total, in_flight_count, identical, reused, pause_s, restore_s)


async def main(args) -> None:
    bodies = requests(args.episodes)
    with tempfile.TemporaryDirectory(prefix="gen-cuts-") as tmpdir:
        tmp = Path(tmpdir)
        worker_proc, worker = start(
            "inference_worker", {"tokens_per_second": args.tokens_per_second, "time_to_first_token_s": args.ttft}, tmp
        )
        try:
            # the uninterrupted run, for the expected results and token counts
            proc, model = start("policy_model", {"upstream": {"base_url": f"{worker}/v1"}}, tmp)
            async with httpx.AsyncClient(timeout=120) as client:
                expected = await asyncio.gather(*(call(client, model, b, f"ref-{i}", 0) for i, b in enumerate(bodies)))
            kill(proc)
            assert all(e is not None for e in expected)
            cuts = await run_phase("cuts", bodies, expected, worker, tmp, args, checkpoint=True)
            base = await run_phase("restart", bodies, expected, worker, tmp, args, checkpoint=False)
        finally:
            kill(worker_proc)
    print_table(args, [cuts, base])


def print_table(args, rows: list[Outcome]) -> None:
    print(
        f"\nGeneration work across a model kill: {args.episodes} episodes, "
        f"worker at {args.tokens_per_second:g} tokens/s, model SIGKILLed {args.cut_after:g} s after the first call "
        "(file:// checkpoint)\n"
    )
    head = (
        "strategy",
        "in flight",
        "tokens before cut",
        "regenerated after restore",
        "generated after restore",
        "total generated",
        "uninterrupted total",
        "prefix tokens reused",
        "results identical",
        "pause s",
        "restore s",
    )
    labels = {"cuts": "generation cuts (checkpoint)", "restart": "restart from boundary"}
    table = [head] + [
        (
            labels[r.name],
            str(r.in_flight),
            str(r.before),
            str(r.regenerated),
            str(r.after),
            str(r.before + r.after),
            str(r.uninterrupted),
            str(r.reused),
            f"{r.identical}/{args.episodes}",
            "-" if r.pause_s is None else f"{r.pause_s:.3f}",
            "-" if r.restore_s is None else f"{r.restore_s:.3f}",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for n, row in enumerate(table):
        print("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\nregenerated = tokens before cut + tokens after restore - uninterrupted total (target with cuts: 0)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--episodes", type=int, default=20, help="episodes, each with one generation in flight at the cut (default 20)"
    )
    parser.add_argument(
        "--tokens-per-second", type=float, default=40.0, help="worker generation speed per stream (default 40)"
    )
    parser.add_argument("--ttft", type=float, default=0.05, help="worker time to first token, seconds")
    parser.add_argument("--cut-after", type=float, default=0.45, help="seconds from the first call to the cut/kill")
    asyncio.run(main(parser.parse_args()))
