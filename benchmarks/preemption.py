"""Schedules, preemption and automatic resume, measured (docs/operations/preemption.md), side by side in one run.

1. **Goodput**: finished rollouts per minute on the demo stack (token recording on), and completed tool calls per
   minute of 8 live clients on a Workplace server holding 1,000 live sessions, with the stack checkpointing itself
   every 30 s and every 10 s against no schedule; on ``file://`` and on S3 (a local SeaweedFS). Each configuration
   runs ``--seconds`` after a warm-up; ``paused`` is the scheduled checkpoints' pauses over that window (the cost
   the rollouts see directly; the rest of the difference is the uploads' CPU and the machine's noise, which the
   spread of the no-schedule rounds shows). Targets: >= 99.5 % (30 s) and >= 99 % (10 s) of no schedule.
2. **Work lost to a preemption** (SIGTERM to every server, 30 s grace), demo stack: tokens generated twice, agent
   steps (tool calls, environment steps) done twice, episodes started from scratch again; target 0 each.
3. **Work lost to a SIGKILL with no warning** under a 10 s schedule, demo stack (slower generation, so a job lasts
   past several checkpoints), the crash at a random moment: the tokens generated again as a share of all, and the
   most any one rollout lost, in seconds of its generation (at most the time from the newest checkpoint's cut to
   the crash; target <= 10 s).
4. **Signal to published**: a Workplace server with N live sessions under 8 live clients, SIGTERM, the supervisor's
   final checkpoint; ``--trials`` times per row, each on the stack resumed from the previous one; p50 and p99 (with
   few trials, p99 is the worst). Targets: <= 10 s at 1,000 sessions, <= 25 s at 10,000.

    .venv/bin/python benchmarks/preemption.py [--sections goodput preemption crash signal] [--storage file s3]
        [--seconds 120] [--sessions 1000 10000] [--trials 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.checkpoint_pause import load, seed_sessions  # noqa: E402
from tests.support.seaweed import start_seaweed  # noqa: E402

from gym_services.base.config import StorageConfig  # noqa: E402
from gym_services.base.text import table  # noqa: E402
from gym_services.control.protocol import DEFAULT_LEASE_S, DEFAULT_PREPARE_TIMEOUT_S  # noqa: E402
from gym_services.coordination.client import ControlClient  # noqa: E402
from gym_services.coordination.coordinator import Coordinator, TransactionResult  # noqa: E402
from gym_services.demo.preemption import crashed, exit_counters, preempted, settings  # noqa: E402
from gym_services.demo.stack import demo_stack  # noqa: E402
from gym_services.demo.story import Run, Story, job_status  # noqa: E402
from gym_services.stack.config import ServerSpec, StackConfig  # noqa: E402
from gym_services.stack.discovery import discover  # noqa: E402
from gym_services.stack.history import read_history  # noqa: E402
from gym_services.stack.launcher import (  # noqa: E402
    StackState,
    is_running,
    stack_secrets,
    stack_storage_config,
    start_stack,
    stop_stack,
)
from gym_services.stack.resume import resume_stack  # noqa: E402
from gym_services.stack.schedule import CheckpointSettings  # noqa: E402
from gym_services.stack.supervision import start_supervisor  # noqa: E402
from gym_services.stack.supervisor import scheduled_checkpoint_id  # noqa: E402

SCHEDULES: list[float | None] = [None, 30.0, 10.0]
TARGETS = {30.0: 99.5, 10.0: 99.0}


@dataclass
class Bench:
    work: Path
    s3_env: dict[str, str]
    s3_config: StorageConfig

    def location(self, storage: str, name: str) -> str:
        return f"s3://bench/{name}" if storage == "s3" else f"file://{self.work / 'ckpt' / name}"

    def env(self, storage: str) -> dict[str, str]:
        return self.s3_env if storage == "s3" else {}


def up(
    bench: Bench, config: StackConfig, storage: str, resume: bool = False, sessions: int = 0
) -> tuple[StackState, list[str]]:
    """A supervised stack as ``gymckpt up`` starts it (resumed from its own checkpoints with ``resume``), with
    ``sessions`` live Workplace sessions seeded before its schedule starts; the sessions' cookies."""
    state = start_stack(config, bench.work, ready_timeout_s=180, env=bench.env(storage), supervise=True)
    storage_config = bench.s3_config if storage == "s3" else None
    if resume:
        asyncio.run(resume_stack(state, storage_config=storage_config))
    cookies = asyncio.run(seed_sessions(state.servers[0].url, sessions)) if sessions else []
    start_supervisor(Path(state.state_dir), env=bench.env(storage))
    return state, cookies


def paused_in(state_dir: Path, since: float, until: float) -> tuple[int, float]:
    """Scheduled checkpoints started in [since, until] (unix) and their pauses' sum."""
    history = read_history(state_dir)
    taken = [c for c in (history.kept if history else []) if since <= c.started_at <= until and c.kind == "scheduled"]
    return len(taken), sum(c.pause_s or 0.0 for c in taken)


# --- 1. goodput ---------------------------------------------------------------------------------------------------


def _tokens_generated(state: StackState) -> float:
    """The policy model's ``gym_model_tokens_generated`` counter (what its engine generated so far)."""
    text = httpx.get(f"{state.url('policy-model')}/metrics", timeout=10).text
    return float(
        sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("gym_model_tokens_generated"))
    )


async def _checkpoints_until(state: StackState, every: float, until: float) -> list[TransactionResult]:
    """Checkpoints every ``every`` seconds until ``until`` (monotonic), as the stack's supervisor takes its scheduled
    ones: the same coordinator call, prepare timeout and lease. The first comes half an interval in, so a window
    holds as many as the schedule gives it (two in 60 s every 30 s)."""
    token = stack_secrets(Path(state.state_dir))["control_token"]
    results: list[TransactionResult] = []
    async with ControlClient(token, timeout_s=DEFAULT_LEASE_S) as client:
        coordinator = Coordinator(await discover(state, client), client, storage_config=stack_storage_config(state))
        due = time.monotonic() + every / 2
        while due < until:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            started = time.monotonic()
            results.append(
                await coordinator.checkpoint(
                    scheduled_checkpoint_id(),
                    state.storage,
                    prepare_timeout_s=min(DEFAULT_PREPARE_TIMEOUT_S, max(2.0, every / 3)),
                    lease_s=DEFAULT_LEASE_S,
                    claimed_by="benchmarks/preemption.py",
                )
            )
            due = max(started + every, time.monotonic())
    return results


def goodput_demo(bench: Bench, storage: str, args: argparse.Namespace) -> dict[float | None, list[dict[str, Any]]]:
    """One demo stack and one long job; windows of ``--seconds`` with no checkpoint, one every 30 s and one every
    10 s in rotation (``--rounds`` times, each round starting with the next schedule), so that the job's phases and
    the machine's noise fall on every schedule alike. Per window: finished rollouts and generated tokens per minute,
    the checkpoints' pauses and, of those, the agents' wait for their tool calls and verifications to finish."""
    name = f"demo-{storage}"
    config = demo_stack(bench.work / name, job_dir=bench.work)
    config.storage = bench.location(storage, name)
    state, _ = up(bench, config, storage)
    got: dict[float | None, list[dict[str, Any]]] = {every: [] for every in SCHEDULES}
    try:
        story = Story(bench.work / f"tasks-{name}", repeats=2000, concurrency=32, say=lambda text: None)
        story.prepare()  # the tasks (a job far longer than every window together)
        story.submit(state, bench.work / f"{name}.jsonl")
        time.sleep(args.warmup)
        for round_ in range(args.rounds):
            for every in SCHEDULES[round_ % 3 :] + SCHEDULES[: round_ % 3]:
                f0, g0, t0 = job_status(state)["finished"], _tokens_generated(state), time.monotonic()
                results = asyncio.run(_checkpoints_until(state, every, t0 + args.seconds)) if every else []
                time.sleep(max(0.0, t0 + args.seconds - time.monotonic()))
                f1, g1, t1 = job_status(state)["finished"], _tokens_generated(state), time.monotonic()
                minutes = (t1 - t0) / 60
                window = {
                    "rate": (f1 - f0) / minutes,
                    "tokens": (g1 - g0) / minutes,
                    "checkpoints": sum(1 for r in results if r.completed),
                    "failed": sum(1 for r in results if not r.completed),
                    "paused": sum(r.pause_s for r in results) / (t1 - t0),
                    "agents": sum(r.timings.get("prepare agent", 0.0) for r in results) / (t1 - t0),
                }
                got[every].append(window)
                print(f"goodput {storage} demo stack {every}: {window}", file=sys.stderr, flush=True)
    finally:
        stop_stack(Path(state.state_dir), kill=True)
    return got


def goodput_sessions(bench: Bench, storage: str, every: float | None, seconds: float, warmup: float) -> dict[str, Any]:
    name = f"sessions-{storage}-{every or 0:g}"
    config = workplace_stack(bench, storage, name, CheckpointSettings(every=every, keep=1000))
    state, cookies = up(bench, config, storage, sessions=1000)
    try:
        url = state.servers[0].url
        calls = run_clients(url, cookies, warmup + seconds)
        first = min(start for start, _, _, _ in calls)
        m0, m1 = first + warmup, first + warmup + seconds  # the window, on the clients' monotonic clock
        done = [c for c in calls if m0 <= c[1] < m1 and c[3]]
        to_wall = time.time() - time.monotonic()
        taken, pause = paused_in(Path(state.state_dir), m0 + to_wall, m1 + to_wall)
    finally:
        stop_stack(Path(state.state_dir), kill=True)
    return {"rate": len(done) / seconds * 60, "checkpoints": taken, "paused": pause / seconds}


def workplace_stack(bench: Bench, storage: str, name: str, checkpoint: CheckpointSettings) -> StackConfig:
    return StackConfig(
        name=name,
        state_dir=str(bench.work / name),
        storage=bench.location(storage, name),
        checkpoint=checkpoint,
        servers={"workplace": ServerSpec(server="workplace_assistant")},
    )


def run_clients(url: str, cookies: list[str], seconds: float, clients: int = 8) -> list[tuple[float, float, int, bool]]:
    """8 live clients calling tools on random sessions for ``seconds``, in a process of their own."""
    ctx = multiprocessing.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    loader = ctx.Process(target=load, args=(url, cookies, clients, stop, started, send), daemon=True)
    loader.start()
    started.wait(60)
    time.sleep(seconds)
    stop.set()
    calls: list[tuple[float, float, int, bool]] = receive.recv() if receive.poll(120) else []
    loader.join(30)
    return calls


def goodput(bench: Bench, args: argparse.Namespace) -> list[list[Any]]:
    """Per storage: the demo stack's windows in rotation on one stack (:func:`goodput_demo`), and the 1,000-session
    Workplace server, a stack per configuration, the schedules in rotation; the median rate, its spread, and the
    paused share."""
    rows: list[list[Any]] = []
    for storage in args.storage:
        demo = goodput_demo(bench, storage, args)
        sessions: dict[float | None, list[dict[str, Any]]] = {every: [] for every in SCHEDULES}
        for _ in range(args.rounds):
            for every in SCHEDULES:
                sessions[every].append(goodput_sessions(bench, storage, every, args.seconds, args.warmup))
                print(f"goodput {storage} 1,000 sessions {every}: {sessions[every][-1]}", file=sys.stderr, flush=True)
        for load_name, got in (("demo stack", demo), ("1,000 sessions", sessions)):
            base = statistics.median(g["rate"] for g in got[None])
            tokens = statistics.median(g["tokens"] for g in got[None]) if "tokens" in got[None][0] else None
            for every in SCHEDULES:
                rates = [g["rate"] for g in got[every]]
                target = TARGETS.get(every or 0.0)
                rows.append(
                    [
                        storage,
                        load_name,
                        f"every {every:g} s" if every else "none",
                        f"{statistics.median(rates):.1f} ({min(rates):.0f}-{max(rates):.0f})",
                        f"{100 * statistics.median(rates) / base:.1f} %",
                        f"{100 * statistics.median(g['tokens'] for g in got[every]) / tokens:.1f} %" if tokens else "",
                        sum(g["checkpoints"] for g in got[every]),
                        f"{100 * statistics.mean(g['paused'] for g in got[every]):.2f} %",
                        f"{100 * statistics.mean(g['agents'] for g in got[every]):.2f} %" if tokens else "",
                        f">= {target} %" if target else "",
                    ]
                )
    return rows


# --- 2. and 3. work lost -------------------------------------------------------------------------------------------


def _steps(counters: dict[str, dict[str, float]], prefix: str) -> dict[str, float]:
    """Agent counters whose name starts with ``prefix``, summed over the agents (label -> value)."""
    out: dict[str, float] = {}
    for name, values in counters.items():
        if not name.startswith("agent"):
            continue
        for key, value in values.items():
            if key.startswith(prefix):
                out[key] = out.get(key, 0.0) + value
    return out


def preemption_loss(bench: Bench) -> list[list[Any]]:
    story = Story(bench.work / "lost-preemption", repeats=1, say=lambda text: None)
    story.prepare()
    base = story.uninterrupted()
    base_counters = exit_counters(story.workdir / "uninterrupted")
    run = preempted(story, settings(every_s=30.0, grace_s=30.0))
    after = exit_counters(story.workdir / "preempted")  # the resumed stack's, logged when it stopped
    lives = (run.exit_counters, after)  # before the signal, after the resume
    steps_twice = sum(sum(_steps(c, "gym_agent_steps").values()) for c in lives) - sum(
        _steps(base_counters, "gym_agent_steps").values()
    )
    fresh = sum(v for c in lives for k, v in _steps(c, "gym_agent_runs").items() if "start=fresh" in k)
    termination = run.termination
    return [
        ["tokens generated twice", run.tokens_before_cut + run.tokens_after_restore - base.tokens_generated, "0"],
        ["agent steps done twice (model calls, tool calls, environment steps)", f"{steps_twice:.0f}", "0"],
        ["episodes started again from scratch", f"{fresh - len(base.results):.0f}", "0"],
        ["episodes live at the signal", termination.final.episodes if termination and termination.final else "-", ""],
        [
            "signal to published",
            f"{termination.signal_to_published_s:.2f} s" if termination and termination.signal_to_published_s else "-",
            "",
        ],
        ["results equal to the uninterrupted run", _equal(base, run), "yes"],
    ]


def _equal(base: Run, run: Run) -> str:
    same = all(run.results.get(k, {}).get("reward") == v.get("reward") for k, v in base.results.items())
    return "yes" if same and len(run.results) == len(base.results) and not run.duplicates else "NO"


def crash_loss(bench: Bench, trials: int) -> list[list[Any]]:
    rows = []
    rng = random.Random(38)
    base: Run | None = None
    for trial in range(trials):
        story = Story(
            bench.work / f"lost-crash-{trial}", repeats=3, tokens_per_second=40.0, checkpoint_at=0.3, say=lambda t: None
        )
        story.prepare()
        base = base or story.uninterrupted()  # the same tasks every trial: one reference
        after_s = rng.uniform(0.0, 10.0)
        run = crashed(story, settings(every_s=10.0, grace_s=30.0), crash_after_s=after_s)
        again = run.tokens_before_cut + run.tokens_after_restore - base.tokens_generated
        newest = run.newest
        cut = (newest.started_at + (newest.pause_s or 0.0)) if newest else 0.0
        window = (run.crashed_at or cut) - cut
        rows.append(
            [
                trial + 1,
                f"{window:.1f} s",
                f"{again} of {base.tokens_generated} ({100 * again / base.tokens_generated:.1f} %)",
                f"<= {window:.1f} s ({window * story.tokens_per_second:.0f} tokens at most)",
                _equal(base, run),
            ]
        )
        print(f"crash {rows[-1]}", file=sys.stderr, flush=True)
    return rows


# --- 4. signal to published ------------------------------------------------------------------------------------------


def signal_to_published(bench: Bench, args: argparse.Namespace) -> list[list[Any]]:
    rows = []
    for sessions in args.sessions:
        for storage in args.storage:
            name = f"signal-{sessions}-{storage}"
            config = workplace_stack(bench, storage, name, CheckpointSettings(every=None, keep=2, termination_grace=60))
            state, cookies = up(bench, config, storage, sessions=sessions)
            took: list[float] = []
            try:
                for trial in range(args.trials):
                    if trial:
                        state, _ = up(bench, config, storage, resume=True)  # the sessions come back by restore
                    took.append(terminate_under_load(state, cookies))
                    print(f"signal {sessions} {storage} trial {trial + 1}: {took[-1]:.2f} s", file=sys.stderr)
            finally:
                stop_stack(Path(state.state_dir), kill=True)
            target = 10.0 if sessions <= 1000 else 25.0
            rows.append(
                [
                    f"{sessions:,}",
                    storage,
                    len(took),
                    f"{statistics.median(took):.2f} s",
                    f"{_p99(took):.2f} s",
                    f"<= {target:g} s",
                ]
            )
    return rows


def terminate_under_load(state: StackState, cookies: list[str]) -> float:
    """SIGTERM to the server while 8 clients call it; the supervisor's signal to published."""
    url = state.servers[0].url
    ctx = multiprocessing.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    loader = ctx.Process(target=load_until_gone, args=(url, cookies, 8, stop, started, send), daemon=True)
    loader.start()
    started.wait(60)
    time.sleep(2)
    os.killpg(state.servers[0].pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while is_running(state.servers[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    if receive.poll(60):
        receive.recv()
    loader.join(30)
    if loader.is_alive():
        loader.kill()
    supervisor = state.supervisor
    while supervisor is not None and is_running(supervisor) and time.monotonic() < deadline:
        time.sleep(0.05)
    history = read_history(Path(state.state_dir))
    termination = history.termination if history else None
    if termination is None or termination.outcome != "published" or termination.signal_to_published_s is None:
        raise RuntimeError(f"the final checkpoint failed: {termination}")
    return termination.signal_to_published_s


def load_until_gone(url: str, cookies: list[str], clients: int, stop: Any, started: Any, conn: Any) -> None:
    """The live clients of ``checkpoint_pause.py`` until the server they call exits (its calls then fail)."""
    try:
        load(url, cookies, clients, stop, started, conn)
    except Exception:  # the server exited under the clients, as a terminated server does
        conn.send([])


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=["goodput", "preemption", "crash", "signal"],
        default=["goodput", "preemption", "crash", "signal"],
    )
    parser.add_argument("--storage", nargs="+", choices=["file", "s3"], default=["file", "s3"])
    parser.add_argument("--seconds", type=float, default=120.0, help="goodput window per configuration (default 120)")
    parser.add_argument("--warmup", type=float, default=15.0, help="goodput warm-up before the window (default 15)")
    parser.add_argument("--rounds", type=int, default=1, help="goodput rounds, the schedules in rotation (default 1)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--trials", type=int, default=5, help="signal-to-published trials per row (default 5)")
    parser.add_argument("--crash-trials", type=int, default=3, help="SIGKILL trials (default 3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gymckpt-preemption-"))
    s3 = start_seaweed(work / "seaweed")
    s3.create_bucket("bench")
    os.environ.update(s3.env())  # this process, the servers and the supervisors reach SeaweedFS through AWS_*
    bench = Bench(work, s3.env(), StorageConfig(endpoint_url=s3.endpoint))
    print(f"load average {os.getloadavg()[0]:.1f} at the start", file=sys.stderr)
    try:
        if "goodput" in args.sections:
            print(
                f"1. goodput, {args.seconds:g} s per row after {args.warmup:g} s (rollouts/min: demo stack; tool "
                "calls/min: 8 clients on 1,000 live Workplace sessions)"
            )
            headers = [
                "storage",
                "load",
                "schedule",
                "per min (spread)",
                "of none",
                "tokens of none",
                "checkpoints",
                "paused",
                "of which agents wait",
                "target",
            ]
            print(table(headers, goodput(bench, args)), flush=True)
        if "preemption" in args.sections:
            print("\n2. work lost to a preemption: SIGTERM to every server of the demo stack, 30 s grace (file)")
            print(table(["", "value", "target"], preemption_loss(bench)), flush=True)
        if "crash" in args.sections:
            print(
                "\n3. work lost to a SIGKILL of everything, a checkpoint every 10 s (demo stack at 40 tokens/s, file)"
            )
            headers = ["trial", "crash after the cut", "tokens generated again", "most any rollout lost", "results"]
            print(table(headers, crash_loss(bench, args.crash_trials)), flush=True)
        if "signal" in args.sections:
            print("\n4. signal to published: SIGTERM to a Workplace server with N live sessions under 8 live clients")
            headers = ["sessions", "storage", "trials", "p50", "p99", "target"]
            print(table(headers, signal_to_published(bench, args)), flush=True)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
