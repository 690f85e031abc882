"""Scale-out: replicas per server, a fleet of inference workers, and what one policy model process carries.

Four tables from one run, every server a real uvicorn process on 127.0.0.1:

1. Rollout collection throughput with 1, 2 and 4 replicas of every participant but the collection, and
   1, 2, 4 built-in inference workers: episodes/s, CPU per episode, and where the CPU went (the
   bottleneck). On a 2-core machine the question is whether anything serialises, not absolute speed.
2. Checkpoint pause with 1, 2, 4, 8 replicas per role (Workplace Assistant as resources, Blackjack as the
   environment) holding the same total sessions: replicas of a role prepare and capture concurrently, so the
   pause must not grow with the replica count. Each is restored into fresh processes too.
3. Worker failover. (a) 64 generations through one policy model over 4 workers, one worker SIGKILLed
   once all 64 stream: tokens regenerated (target 0), generations failed (target 0), every response equal
   to the uninterrupted one. (b) The same in rollouts: the demo tasks on 4 workers, 64 episodes in flight,
   one worker SIGKILLed while it streams generations: tokens regenerated, episodes failed or run again
   (target 0), rewards equal to an uninterrupted run. In (a) worker tokens come from the workers' ``stats_dir``
   mirrors, which outlive a SIGKILL; in (b) they are what the policy models received, as in the demo.
4. Streams one policy model process carries: N concurrent generations through one policy model over 4
   workers; tokens per CPU-second of the policy model give the streams one core carries at a given pace.

    .venv/bin/python benchmarks/scale_out.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gym_services.base.affinity import replica_for  # noqa: E402
from gym_services.base.text import table  # noqa: E402
from gym_services.coordination.client import ControlClient  # noqa: E402
from gym_services.coordination.coordinator import Coordinator  # noqa: E402
from gym_services.coordination.transaction import TransactionPhase  # noqa: E402
from gym_services.demo.report import compare, regenerated_tokens  # noqa: E402
from gym_services.demo.stack import demo_stack, write_tasks  # noqa: E402
from gym_services.demo.story import Story  # noqa: E402
from gym_services.stack.config import ServerSpec, StackConfig  # noqa: E402
from gym_services.stack.discovery import discover  # noqa: E402
from gym_services.stack.launcher import StackState, stack_secrets, start_stack, stop_stack  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def worker_tokens(
    state: StackState, stats_dir: Path, delivered: dict[str, int] | None = None, group: str = "worker"
) -> int:
    """Tokens every built-in worker of the stack generated, killed ones included.

    A live worker's count is its own (each mirrors its count to a file). A worker SIGKILLed mid-stream is
    counted by ``delivered`` (worker name -> tokens), what its clients received from it: the only exact
    count, since no sender can make "the bytes reached the kernel" and "counted" one atomic step. A kill
    between the two leaves the worker's own mirror one token short per stream, or one over if it counted
    first. A token that never reached a client is lost with the worker, like the tokens lost to a crash.
    """
    from gym_services.models.inference_worker.generation import read_token_mirror, token_mirror_path

    delivered = delivered or {}
    return sum(
        delivered[w.name] if w.name in delivered else read_token_mirror(token_mirror_path(stats_dir, w.name))
        for w in state.replicas_of(group)
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (the servers are single processes)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on a CPU of every thread of these processes (/proc/<pid>/task/*/schedstat: exact, not ticks)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue  # a worker thread that ended between listing and reading
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def cpu_by_group(state: StackState) -> dict[str, float]:
    out: dict[str, float] = {}
    for server in state.servers:
        kind = "agents" if server.server.endswith("agent") else server.group_name
        out[kind] = out.get(kind, 0.0) + cpu_seconds(server.pid)
    return out


async def wait_job(url: str, token: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        while time.monotonic() < deadline:
            job = (await http.get(f"{url}/jobs/current")).json()
            if job["state"] == "completed":
                return job
            await asyncio.sleep(0.05)
    raise RuntimeError(f"collection did not finish in {timeout_s}s")


# --- 1. throughput -------------------------------------------------------------------------------------------


def throughput(tmp: Path, replicas: int, workers: int, repeats: int, concurrency: int) -> dict[str, Any]:
    work = tmp / f"tp-{replicas}-{workers}"
    tasks = work / "tasks.jsonl"
    write_tasks(tasks)
    stack = demo_stack(
        work / "stack", tokens_per_second=150.0, latency_s=0.1, job_dir=work, replicas=replicas, workers=workers
    )
    token = stack_secrets(work / "stack")["control_token"]  # the demo stack's collection takes the control token
    state = start_stack(stack, work, ready_timeout_s=300)
    try:
        collection = state.url("collection")
        before, busy_before = cpu_by_group(state), machine_busy_seconds()
        started = time.perf_counter()
        spec = {
            "tasks_path": str(tasks),
            "output_path": str(work / "out.jsonl"),
            "repeats": repeats,
            "concurrency": concurrency,
        }
        httpx.post(
            f"{collection}/jobs", json=spec, timeout=30, headers={"authorization": f"Bearer {token}"}
        ).raise_for_status()
        job = asyncio.run(wait_job(collection, token, 900))
        wall = time.perf_counter() - started
        after, busy_after = cpu_by_group(state), machine_busy_seconds()
    finally:
        stop_stack(work / "stack")
    cpu = {k: after[k] - before.get(k, 0.0) for k in after}
    total = sum(cpu.values())
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:2]
    load = total / wall
    others = max(0.0, (busy_after - busy_before) - total) / wall  # cores other processes of the machine took
    cores = os.cpu_count() or 1
    if load + others > 0.8 * cores:
        verdict = f"CPU ({cores} cores; {others:.1f} of them busy with other processes)"
    else:
        verdict = "latency (model pace, tool latency)"
    return {
        "replicas": replicas,
        "workers": workers,
        "episodes": job["finished"],
        "errors": job["errors"],
        "eps": job["finished"] / wall,
        "wall": wall,
        "cpu_per_episode": total / max(1, job["finished"]),
        "load": load,
        "others": others,
        "bottleneck": f"{verdict}; most CPU: " + ", ".join(f"{k} {v / wall:.0%}" for k, v in top),
    }


# --- 2. checkpoint pause versus replicas ---------------------------------------------------------------------

WORKPLACE_CALLS = [
    ("email_send_email", {"recipient": "nadia.moreau@atlas.com", "subject": "Status", "body": "On track."}),
    (
        "calendar_create_event",
        {
            "event_name": "Sync",
            "participant_email": "nadia.moreau@atlas.com",
            "event_start": "2023-12-01 10:00:00",
            "duration": "30",
        },
    ),
]
BLACKJACK_RESET = {"responses_create_params": {"input": [{"role": "user", "content": "play"}]}}


async def seed(state: StackState, sessions: int) -> None:
    """``sessions`` Workplace sessions and as many Blackjack episodes, each on the replica its rollout hashes to.

    Every request names its session's cookie itself (an explicit Cookie header wins over the shared client's
    jar, which would otherwise hand one session's cookie to the next: a few dozen sessions instead of N)."""
    workplace, blackjack = state.urls("workplace"), state.urls("blackjack")
    limit = asyncio.Semaphore(32)
    cookies: set[str] = set()

    async def one(i: int, http: httpx.AsyncClient) -> None:
        rid = f"r{i}"
        ident = {"x-ng-rollout-id": rid, "x-ng-attempt": "0"}
        async with limit:
            url = workplace[replica_for(rid, len(workplace))]
            seeded = await http.post(f"{url}/seed_session", json={}, headers={**ident, "cookie": ""})
            seeded.raise_for_status()
            cookie = "; ".join(f"{k}={v}" for k, v in sorted(seeded.cookies.items()))
            cookies.add(cookie)
            for name, args in WORKPLACE_CALLS:
                (await http.post(f"{url}/{name}", json=args, headers={**ident, "cookie": cookie})).raise_for_status()
            url = blackjack[replica_for(rid, len(blackjack))]
            (await http.post(f"{url}/reset", json=BLACKJACK_RESET, headers={**ident, "cookie": ""})).raise_for_status()

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(one(i, http) for i in range(sessions)))
    if len(cookies) != sessions:
        raise RuntimeError(f"seeding made {len(cookies)} Workplace sessions, not {sessions}")


async def transaction(state: StackState, token: str, location: str, cid: str, restore: bool, cpu: dict | None = None):
    """One checkpoint (or restore). ``cpu`` receives the CPU every process spent under the pause (from the
    ``Preparing`` event to the first after resume), in ns: ``all`` (coordinator and servers) and ``coordinator``."""
    pids = [s.pid for s in state.servers]

    async def on_event(phase: TransactionPhase, detail: dict[str, Any]) -> None:
        if cpu is None:
            return
        if phase is TransactionPhase.PREPARING:
            cpu["coordinator"], cpu["all"] = -cpu_ns([os.getpid()]), -cpu_ns([os.getpid(), *pids])
        elif phase in (TransactionPhase.PERSISTING, TransactionPhase.COMPLETED) and "end" not in cpu:
            cpu["end"] = 1  # background: Persisting follows resume; sync: Completed does
            cpu["coordinator"] += cpu_ns([os.getpid()])
            cpu["all"] += cpu_ns([os.getpid(), *pids])

    async with ControlClient(token, timeout_s=300) as client:
        coordinator = Coordinator(await discover(state, client), client, on_event=on_event)
        if restore:
            return await coordinator.restore(cid, location, lease_s=120)
        return await coordinator.checkpoint(cid, location, prepare_timeout_s=60, lease_s=120)


def pause(tmp: Path, replicas: int, sessions: int) -> dict[str, Any]:
    work = tmp / f"pause-{replicas}"
    stack = StackConfig(
        name="bench",
        state_dir=str(work / "stack"),
        servers={
            "workplace": ServerSpec(server="workplace_assistant", replicas=replicas),
            "blackjack": ServerSpec(server="blackjack", replicas=replicas),
        },
    )
    location = f"file://{work / 'store'}"
    token = stack_secrets(work / "stack")["control_token"]
    state = start_stack(stack, work, ready_timeout_s=300)
    try:
        asyncio.run(seed(state, sessions))
        cpu: dict[str, int] = {}
        result = asyncio.run(transaction(state, token, location, "ck", restore=False, cpu=cpu))
        assert result.status == "completed", result.error
    finally:
        stop_stack(work / "stack", kill=True)
    state = start_stack(stack, work, ready_timeout_s=300)
    try:
        restored = asyncio.run(transaction(state, token, location, "ck", restore=True))
        assert restored.status == "completed", restored.error
    finally:
        stop_stack(work / "stack", kill=True)
    per_replica = [p.records for p in result.participants if p.participant_id.startswith("workplace")]
    return {
        "replicas": replicas,
        "participants": len(result.participants),
        "records": result.records,
        "bytes": result.bytes,
        "spread": f"{min(per_replica)}-{max(per_replica)}",
        "pause": result.pause_s,
        "prepare": result.timings["prepare"],
        # a background checkpoint captures under the pause and persists after it; a sync one persists under it too
        "capture": result.timings.get("capture", 0.0),
        "method": result.method,
        "published": result.published_s or 0.0,
        "restore": restored.pause_s,
        "resume": result.timings.get("resume", 0.0),
        "cpu": cpu["all"] / 1e9,
        "coordinator_cpu": cpu["coordinator"] / 1e9,
        # the pause cannot be shorter than the CPU it used spread over every core (and the coordinator's own)
        "floor": max(cpu["all"] / 1e9 / (os.cpu_count() or 1), cpu["coordinator"] / 1e9),
    }


# --- 3. worker failover ------------------------------------------------------------------------------------------


def failover(tmp: Path, repeats: int) -> tuple[dict[str, Any], Any]:
    story = Story(
        tmp / "failover",
        repeats=repeats,
        concurrency=64,
        tokens_per_second=60.0,
        workers=4,
        timeout_s=600,
        say=lambda text: None,
    )
    story.prepare()
    base = story.uninterrupted()
    run = story.worker_failover(want=12)
    verdict = compare(base, run, story.agent_env, tokens=False)
    errors = sum(1 for row in run.results.values() if "error" in row)
    models = [v for k, v in run.in_flight.items() if k.startswith("policy-model")]
    return {
        "episodes": len(run.results),
        "killed": run.worker_killed,
        "delivered": run.delivered[run.worker_killed["name"]],
        "failovers": sum(m["failovers"] for m in models),
        "regenerated": regenerated_tokens(base, run),
        "uninterrupted": base.tokens_generated,
        "tokens": run.tokens_before_cut,
        "failed": errors,
        "reruns": run.reruns_before_checkpoint,
        "rewards_equal": verdict.ok,
        "problems": verdict.problems,
    }, story


def generation_failover(tmp: Path, generations: int = 64, workers: int = 4, pace: float = 20.0) -> dict[str, Any]:
    """``generations`` concurrent generations through one policy model over ``workers`` workers; one worker is
    SIGKILLed once every generation streams: each response must equal the uninterrupted one, and the tokens every
    worker generated (the live ones' token mirrors, the killed one's as the policy model received them) must add up
    to exactly the tokens in the responses."""
    from tests.services.models.policy_model.model_support import REQUESTS

    from gym_services.demo.story import delivered_by, kill_process
    from gym_services.models.inference_worker.generation import read_token_mirror, token_mirror_path

    work = tmp / "generation-failover"
    stats_dir = work / "tokens"
    stack = StackConfig(
        name="failover",
        state_dir=str(work / "stack"),
        servers={
            "worker": ServerSpec(
                server="inference_worker",
                participant=False,
                replicas=workers,
                config={"tokens_per_second": pace, "time_to_first_token_s": 0.05, "stats_dir": str(stats_dir)},
            ),
            "model": ServerSpec(
                server="policy_model", config={"upstream": {"base_url": "{url:worker}/v1", "health_interval_s": 0.5}}
            ),
        },
    )
    token = stack_secrets(work / "stack")["control_token"]
    state = start_stack(stack, work, ready_timeout_s=300)
    kinds = sorted(REQUESTS)
    try:
        model, victim = state.replicas_of("model")[0], state.replicas_of("worker")[-1]

        async def run(prefix: str, kill: bool) -> tuple[list[httpx.Response], dict[str, Any]]:
            limits = httpx.Limits(max_connections=generations + 8)
            async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                tasks = [
                    asyncio.create_task(
                        http.post(
                            f"{model.url}/v1/responses",
                            json=REQUESTS[kinds[i % len(kinds)]],
                            headers={"x-ng-rollout-id": f"{prefix}-{i}", "x-ng-attempt": "0"},
                        )
                    )
                    for i in range(generations)
                ]
                seen: dict[str, Any] = {}
                if kill:  # once every generation streams, the victim still in the middle of its own
                    deadline = time.monotonic() + 120
                    while True:
                        everyone = [(await http.get(f"{w.url}/stats")).json() for w in state.replicas_of("worker")]
                        mine = everyone[-1]
                        if (
                            sum(w["active"] for w in everyone) >= generations
                            and mine["tokens_generated"] >= mine["requests"]
                        ):
                            break
                        if any(t.done() for t in tasks) or time.monotonic() > deadline:
                            raise RuntimeError(f"the generations did not all stream at once: {everyone}")
                        await asyncio.sleep(0.01)
                    kill_process(victim.pid)
                    seen = {
                        "streaming": sum(w["active"] for w in everyone),
                        "on_victim": mine["active"],
                        "victim_tokens": read_token_mirror(token_mirror_path(stats_dir, victim.name)),
                    }
                replies = await asyncio.gather(*tasks)
                live = (
                    await http.get(
                        f"{model.url}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {token}"}
                    )
                ).json()["live"]
            return replies, {**seen, "live": live}

        base, _ = asyncio.run(run("base", kill=False))
        base_tokens = worker_tokens(state, stats_dir, group="worker")
        victim_base = read_token_mirror(token_mirror_path(stats_dir, victim.name))
        killed, seen = asyncio.run(run("kill", kill=True))
        # the killed worker counts as the policy model received it (its fleet counted both runs: one process)
        received = delivered_by({"policy-model": seen["live"]}, victim.url)
        seen["victim_received"] = received - victim_base
        kill_tokens = worker_tokens(state, stats_dir, {victim.name: received}, group="worker") - base_tokens
    finally:
        stop_stack(work / "stack", kill=True)
    failed = [r for r in killed if r.status_code != 200]
    reference = {kinds[i % len(kinds)]: r.json() for i, r in enumerate(base) if r.status_code == 200}
    equal = not failed and all(r.json() == reference[kinds[i % len(kinds)]] for i, r in enumerate(killed))
    total = sum(r.json()["usage"]["output_tokens"] for r in killed if r.status_code == 200)
    return {
        "generations": generations,
        "streaming": seen["streaming"],
        "on_victim": seen["on_victim"],
        "victim_tokens": seen["victim_tokens"] - victim_base,
        "victim_received": seen["victim_received"],
        "failovers": seen["live"]["failovers"],
        "total": total,
        "generated": kill_tokens,
        "base_generated": base_tokens,
        "failed": len(failed),
        "equal": equal,
    }


# --- 4. streams per policy model process ---------------------------------------------------------------------------


def streams(tmp: Path, counts: list[int], pace: float) -> list[dict[str, Any]]:
    from tests.services.models.policy_model.model_support import REQUESTS

    work = tmp / "streams"
    stack = StackConfig(
        name="streams",
        state_dir=str(work / "stack"),
        servers={
            "worker": ServerSpec(
                server="inference_worker",
                participant=False,
                replicas=4,
                config={"tokens_per_second": pace, "time_to_first_token_s": 0.05},
            ),
            "model": ServerSpec(
                server="policy_model", config={"upstream": {"base_url": "{url:worker}/v1", "max_connections": 4096}}
            ),
        },
    )
    state = start_stack(stack, work, ready_timeout_s=300)
    rows = []
    bodies = [REQUESTS[k] for k in sorted(REQUESTS)]
    try:
        model = state.replicas_of("model")[0]

        async def fire(n: int) -> int:
            limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
            async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                replies = await asyncio.gather(
                    *(
                        http.post(
                            f"{model.url}/v1/responses",
                            json=bodies[i % len(bodies)],
                            headers={"x-ng-rollout-id": f"s{n}-{i}", "x-ng-attempt": "0"},
                        )
                        for i in range(n)
                    )
                )
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200][:1]
            return sum(r.json()["usage"]["output_tokens"] for r in replies)

        for n in counts:
            cpu0, t0 = cpu_seconds(model.pid), time.perf_counter()
            tokens = asyncio.run(fire(n))
            wall, cpu = time.perf_counter() - t0, cpu_seconds(model.pid) - cpu0
            per_cpu = tokens / cpu if cpu else float("inf")
            rows.append(
                {
                    "streams": n,
                    "tokens": tokens,
                    "wall": wall,
                    "rate": tokens / wall,
                    "offered": n * pace,
                    "model_cpu": cpu / wall,
                    "per_cpu_s": per_cpu,
                    "carried": per_cpu / pace,
                }
            )
    finally:
        stop_stack(work / "stack")
    return rows


def pause_table(tmp: Path, sessions: int) -> None:
    """Table 2: the pause with 1, 2, 4, 8 replicas per role, and the CPU it used."""
    t2 = [pause(tmp, r, sessions=sessions) for r in (1, 2, 4, 8)]
    method = t2[0]["method"].value if t2[0]["method"] is not None else "-"
    print(
        f"2) checkpoint pause vs replicas per role (workplace_assistant + blackjack, same total sessions; "
        f"method {method}: the pause is prepare + capture, the upload runs after it)"
    )
    print(
        table(
            [
                "replicas/role",
                "participants",
                "records",
                "records/replica",
                "pause ms",
                "prepare ms",
                "capture ms",
                "resume ms",
                "CPU under pause ms",
                "coordinator CPU ms",
                "CPU floor ms",
                "pause / floor",
                "published s",
                "restore s",
            ],
            [
                [
                    r["replicas"],
                    r["participants"],
                    r["records"],
                    r["spread"],
                    f"{r['pause'] * 1e3:.1f}",
                    f"{r['prepare'] * 1e3:.1f}",
                    f"{r['capture'] * 1e3:.1f}",
                    f"{r['resume'] * 1e3:.1f}",
                    f"{r['cpu'] * 1e3:.1f}",
                    f"{r['coordinator_cpu'] * 1e3:.1f}",
                    f"{r['floor'] * 1e3:.1f}",
                    f"{r['pause'] / r['floor']:.2f}" if r["floor"] else "-",
                    f"{r['published']:.3f}",
                    f"{r['restore']:.3f}",
                ]
                for r in t2
            ],
        ),
        flush=True,
    )
    print(
        f"   CPU under pause: every process (coordinator and servers) from prepare to the last resume; CPU floor: "
        f"that CPU over this machine's {os.cpu_count()} cores (or the coordinator's own, if larger). A pause near "
        "its floor is bound by CPU, not by participants waiting on one another."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer configurations and episodes")
    parser.add_argument(
        "--only", choices=["2", "3a"], help="run one section only: 2 prints its table, 3a its numbers as JSON"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-scale-"))
    grid = [(1, 1), (2, 2), (4, 4)] if args.quick else [(r, w) for r in (1, 2, 4) for w in (1, 2, 4)]
    ok = False
    if args.only:
        try:
            if args.only == "2":
                pause_table(tmp, sessions=200 if args.quick else 400)
            else:
                print(json.dumps(generation_failover(tmp), indent=1))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:  # each table as soon as it is measured
        t1 = [throughput(tmp, r, w, repeats=2 if args.quick else 4, concurrency=64) for r, w in grid]
        print(
            "1) rollout collection throughput "
            "(demo tasks, 64 in flight, workers at 150 tokens/s per stream, tools 0.1 s)"
        )
        print(
            table(
                [
                    "replicas",
                    "workers",
                    "episodes",
                    "errors",
                    "episodes/s",
                    "wall s",
                    "CPU s/episode",
                    "CPU load (stack)",
                    "CPU load (others)",
                    "bottleneck",
                ],
                [
                    [
                        r["replicas"],
                        r["workers"],
                        r["episodes"],
                        r["errors"],
                        f"{r['eps']:.2f}",
                        f"{r['wall']:.1f}",
                        f"{r['cpu_per_episode']:.3f}",
                        f"{r['load']:.2f}",
                        f"{r['others']:.2f}",
                        r["bottleneck"],
                    ]
                    for r in t1
                ],
            ),
            flush=True,
        )
        print()

        pause_table(tmp, sessions=200 if args.quick else 400)
        print()

        g = generation_failover(tmp)
        print(
            f"3a) worker failover: {g['generations']} generations through one policy model over 4 workers (20 tokens/s "
            "each), one worker SIGKILLed while every generation streams"
        )
        print(
            table(
                ["", "value"],
                [
                    [
                        "generations streaming at the kill (all workers / killed one)",
                        f"{g['streaming']} / {g['on_victim']}",
                    ],
                    [
                        "tokens the killed worker streamed: received by the model / its own count",
                        f"{g['victim_received']} / {g['victim_tokens']}",
                    ],
                    ["generations continued on another worker", g["failovers"]],
                    ["tokens in the responses / generated by every worker", f"{g['total']} / {g['generated']}"],
                    ["tokens regenerated (target 0)", g["generated"] - g["total"]],
                    ["generations failed (target 0)", g["failed"]],
                    ["every response equal to the uninterrupted one", "yes" if g["equal"] else "NO"],
                ],
            ),
            flush=True,
        )
        print()

        t3, _ = failover(tmp, repeats=3)
        k = t3["killed"]
        print(
            "3b) worker failover in rollouts: the demo tasks on 4 workers, 64 episodes in flight, one worker SIGKILLed "
            "mid-generation"
        )
        print(
            table(
                ["", "value"],
                [
                    ["episodes", t3["episodes"]],
                    ["generations streaming from the killed worker at the kill", k["streaming"]],
                    ["tokens the killed worker streamed, as the policy models received them", t3["delivered"]],
                    ["generations continued on another worker", t3["failovers"]],
                    ["tokens, uninterrupted / with the kill", f"{t3['uninterrupted']} / {t3['tokens']}"],
                    ["tokens regenerated (target 0)", t3["regenerated"]],
                    ["episodes failed / run again (target 0)", f"{t3['failed']} / {t3['reruns']}"],
                    [
                        "rewards equal to the uninterrupted run",
                        "yes" if t3["rewards_equal"] else "NO: " + "; ".join(t3["problems"][:3]),
                    ],
                ],
            ),
            flush=True,
        )
        print()

        t4 = streams(tmp, [64, 256] if args.quick else [64, 256, 1024], pace=20.0)
        print("4) one policy model process, 4 workers at 20 tokens/s per stream: how many streams it carries")
        print(
            table(
                [
                    "streams",
                    "tokens",
                    "wall s",
                    "tokens/s",
                    "offered tokens/s",
                    "model CPU (cores)",
                    "tokens per model CPU-s",
                    "streams one core carries at 20 tok/s",
                ],
                [
                    [
                        r["streams"],
                        r["tokens"],
                        f"{r['wall']:.1f}",
                        f"{r['rate']:.0f}",
                        f"{r['offered']:.0f}",
                        f"{r['model_cpu']:.2f}",
                        f"{r['per_cpu_s']:.0f}",
                        f"{r['carried']:.0f}",
                    ]
                    for r in t4
                ],
            ),
            flush=True,
        )
        ok = (
            t3["regenerated"] == 0
            and t3["failed"] == 0
            and t3["rewards_equal"]
            and g["equal"]
            and g["generated"] == g["total"]
            and g["failed"] == 0
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"failover_ok": ok}))


if __name__ == "__main__":
    main()
