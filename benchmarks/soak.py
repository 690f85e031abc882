"""Soak: the demo stack collecting for a long while with a checkpoint every 30 s and a SIGKILL of every process
followed by a restore every 5 minutes; resources, pause and size must stay flat, and no rollout may be lost,
duplicated or failed (``benchmarks/RESULTS.md`` keeps the runs).

The demo stack (every server its own process, the tasks of all four environments interleaved, ``--repeats``
rollouts per task so one job runs long) collects. Every ``--checkpoint-every`` seconds a ``background`` checkpoint is
taken and published; right after it every server is sampled from /proc: resident memory (VmRSS), open file
descriptors and threads, with the episodes the collection finished so far. Every ``--kill-every`` seconds every
process is SIGKILLed and fresh ones restore the newest published checkpoint (what finished after it is run again).
Before each checkpoint the soak reads and drops the token ledger of every rollout finished so far, as a trainer
does (the policy model keeps a rollout's training tokens until that acknowledgement). A job that finishes is checked
and the collection server takes the next one (a fresh rollout prefix) on the same stack, until ``--duration`` has
passed: a process lives from one kill to the next.

The table, per server: RSS at the first and last sample and its slope in MB per 1,000 finished episodes (a
least-squares fit within each process's life - a restore starts a new process - over its samples after the first
``--warm-up`` seconds of it); the slope over the hour of each life's last sample (what a process holds when it is
killed: growth that a restore carries over, or that a life's warm-up ends higher each time, shows here), and the
ranges of open descriptors and threads; then the checkpoints' pause and size (first, median, last, slope per hour);
then the rollouts: every (task, repeat) of every finished job exactly once (lost: missing from the output;
duplicated: written twice; failed: an error row). Every failed rollout is printed with its error row's text and
the lines of the servers' logs that name it, and the work folder (every server's log) is kept when any rollout
failed, was lost or duplicated (or always, with ``--workdir``).

    .venv/bin/python benchmarks/soak.py [--duration 3600] [--checkpoint-every 30] [--kill-every 300]
        [--storage embedded-s3|file:///path|s3://bucket/prefix] [--workdir DIR] [--samples FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import Chaos, add_stack_arguments  # noqa: E402

from gym_services.base.config import StorageConfig  # noqa: E402
from gym_services.demo.story import MODEL, Run, Story  # noqa: E402
from gym_services.models.policy_model.ledger.client import LedgerClient, LedgerRefused  # noqa: E402
from gym_services.stack.launcher import StackError, is_running, read_state  # noqa: E402


@dataclass
class Sample:
    at: float  # seconds since the soak started
    episodes: int  # finished episodes, every job so far
    life: str  # which process (server name, pid): a restore starts new ones
    age: float  # seconds since this process was first sampled
    rss_kib: int
    fds: int
    threads: int


@dataclass
class Failure:
    """A failed rollout: its error row's text, and the lines of its job's server logs that name it."""

    job: int
    rollout_id: str
    error: str
    log_lines: list[str]


#: log lines kept per failed rollout (the last ones: nearest the failure)
LOG_LINES_PER_FAILURE = 12


def log_lines_naming(logs_dir: Path, rollout_id: str, limit: int = LOG_LINES_PER_FAILURE) -> list[str]:
    """The last ``limit`` lines of the server logs in ``logs_dir`` that name ``rollout_id`` (as a JSON value)."""
    needle = json.dumps(rollout_id)
    found: list[tuple[float, str]] = []
    for log in sorted(logs_dir.glob("*.log")):
        with contextlib.suppress(OSError):
            for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
                if needle in line:
                    try:
                        at = float(json.loads(line).get("ts", 0.0))
                    except (ValueError, AttributeError):
                        at = 0.0
                    found.append((at, f"{log.stem}: {line}"))
    return [line for _, line in sorted(found, key=lambda f: f[0])][-limit:]


@dataclass
class Soak:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    checkpoints: list[tuple[float, float, int, int]] = field(
        default_factory=list
    )  # (at, pause s, bytes written, records)
    loads: list[float] = field(default_factory=list)  # the 1-minute load average at each checkpoint
    restores: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    born: dict[str, float] = field(default_factory=dict)  # life -> when it was first sampled
    jobs: int = 0
    trainer: Trainer = field(default_factory=lambda: Trainer())
    rollouts: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)


def proc_status(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS KiB, open descriptors, threads) of a process, None once it is gone."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return int(fields["VmRSS"].split()[0]), len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])
    except (OSError, KeyError, ValueError):
        return None


def check_rows(chaos: Chaos, soak: Soak, total: int | None) -> None:
    """No rollout written twice, none an error row; with ``total`` (a finished job) none missing either."""
    rows = [json.loads(line) for line in chaos.output.read_text(encoding="utf-8").splitlines()]
    seen = Counter(row["_ng_rollout_id"] for row in rows)
    soak.rollouts += len(seen)
    soak.duplicated += sorted(r for r, n in seen.items() if n > 1)
    soak.failed += [
        Failure(
            chaos.jobs,
            row["_ng_rollout_id"],
            str(row["error"]),
            log_lines_naming(chaos.dir / "logs", row["_ng_rollout_id"]),
        )
        for row in rows
        if "error" in row
    ]
    if total is not None:
        soak.jobs += 1
        soak.lost += [f"job {chaos.jobs}: {total - len(seen)} of {total} rollouts missing"] if len(seen) < total else []


@dataclass
class Trainer:
    """What a trainer does with the token ledger (``docs/protocol.md``, "The token ledger"): once a rollout's
    row is written, freeze its ledger and drop that freeze - the acknowledgement that lets the policy model
    release the rollout's tokens. Without it the ledger holds every rollout's tokens until read, as it must.

    After a restore the ledgers of rollouts consumed since that checkpoint are back (under version + 1, so the
    earlier drop cannot retire them): they are consumed again."""

    consumed: set[str] = field(default_factory=set)
    dropped: int = 0
    #: rollouts consumed without a drop, by why: the drop answered false (the ledger changed after the freeze),
    #: or the freeze found no ledger (not_found) or a dropped one (ledger_closed: after a restore, dropped again)
    undropped: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)

    def consume(self, chaos: Chaos, *, again: bool = False) -> None:
        if not chaos.output.exists():
            return
        rows = [json.loads(line) for line in chaos.output.read_text(encoding="utf-8").splitlines()]
        finished = {row["_ng_rollout_id"] for row in rows}
        todo = sorted(finished if again else finished - self.consumed)
        if todo:
            asyncio.run(self._consume(chaos.state.urls(MODEL), todo))

    async def _consume(self, model_urls: list[str], rollout_ids: list[str]) -> None:
        """Freeze and drop each rollout's ledger, 16 at a time: one after another, a trainer that fell behind a
        busy collection (a few hundred rollouts per checkpoint, two calls each) stayed behind it, and the
        ledgers it had not dropped yet read as the policy model's growth."""
        client = LedgerClient(model_urls)
        slots = asyncio.Semaphore(16)

        async def one(rollout_id: str) -> None:
            async with slots:
                try:
                    frozen = await client.freeze(rollout_id)
                    if await client.drop(rollout_id, frozen.snapshot_id, frozen.version):
                        self.dropped += 1
                    else:
                        self.undropped["drop answered false"] += 1
                except LedgerRefused as exc:
                    if exc.code not in ("not_found", "ledger_closed"):  # none recorded here, or dropped already
                        self.refused.append(f"{rollout_id}: {exc}")
                        return
                    self.undropped[exc.code] += 1
                self.consumed.add(rollout_id)

        try:
            await asyncio.gather(*(one(rollout_id) for rollout_id in rollout_ids))
        finally:
            await client.close()


def slope_per_1000(points: dict[str, list[tuple[float, float]]]) -> float:
    """Least-squares slope of y over x pooled within groups (each group centred on its own means), times 1,000."""
    num = den = 0.0
    for pts in points.values():
        if len(pts) < 2:
            continue
        mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
        num += sum((x - mx) * (y - my) for x, y in pts)
        den += sum((x - mx) ** 2 for x, _ in pts)
    return num / den * 1000 if den else float("nan")


def interleave(story: Story) -> None:
    """Order the job's tasks round-robin across agents. The collection runs a job task by task (every repeat of
    one, then the next), and the demo's tasks come one environment after another, so each agent would work for a
    stretch of the job and idle for the rest: a process's kept results (a bounded cache that fills in its first
    minute of work) would then grow inside a sampled life whenever its environment's turn came, and read as a slope.
    Interleaved, a turn is one task's repeats (well under a minute), and every process works throughout."""
    by_agent: dict[str, list[dict]] = defaultdict(list)
    for task in story.tasks:
        by_agent[task["agent"]].append(task)
    queues = list(by_agent.values())
    ordered = [queue[i] for i in range(max(map(len, queues))) for queue in queues if i < len(queue)]
    story.tasks_path.write_text("".join(json.dumps(task) + "\n" for task in ordered))
    story.tasks = ordered


def wait_published(chaos: Chaos, timeout_s: float = 120) -> None:
    """Until a checkpoint of the running job is published: a kill restores the newest one (the job's first may
    still be uploading in the background)."""
    deadline = time.monotonic() + timeout_s
    while not any(chaos.published(c) for c in chaos.taken):
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint of job {chaos.jobs} was published in {timeout_s:g} s: {chaos.taken}")
        time.sleep(0.1)


def run(args: argparse.Namespace, say, soak: Soak) -> None:
    if args.workdir is not None:
        tmp = Path(args.workdir).resolve()
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="gymckpt-soak-"))
    storage_config = (
        StorageConfig(endpoint_url=args.s3_endpoint) if args.storage and args.storage.startswith("s3://") else None
    )
    story = Story(
        tmp / "story",
        storage=args.storage,
        storage_config=storage_config,
        repeats=args.repeats,
        tokens_per_second=args.tokens_per_second,
        timeout_s=600,
        say=lambda text: None,
    )
    started = time.monotonic()
    ok = False
    chaos: Chaos | None = None
    try:
        story.prepare()
        interleave(story)
        chaos = Chaos(story, Run(), random.Random(args.seed), "a", say=say)
        episodes_before = 0  # episodes of the jobs already finished
        next_kill = time.monotonic() + args.kill_every  # across jobs: a job may finish sooner
        job = 0
        chaos.start()
        while time.monotonic() - started < args.duration:
            job += 1
            # the collection server takes the next job (a fresh rollout prefix) on the same stack
            chaos.jobs, chaos.output = job, story.workdir / f"job-{job}.jsonl"
            chaos.newest, chaos.taken = None, []
            soak.trainer.consumed = set()
            chaos.story.submit(chaos.state, chaos.output)
            while time.monotonic() - started < args.duration:
                next_checkpoint = time.monotonic() + args.checkpoint_every
                status = chaos.job()
                while status["state"] != "completed" and time.monotonic() < next_checkpoint:
                    time.sleep(0.5)
                    status = chaos.job()
                if status["state"] == "completed":
                    break
                soak.trainer.consume(chaos)  # the rollouts finished so far: their ledgers read and dropped
                cid = chaos.next_id()
                result = asyncio.run(chaos._checkpoint(cid))
                if result.status != "completed":
                    raise AssertionError(f"checkpoint {cid} failed: {result.error}")
                chaos.taken.append(cid)
                at = time.monotonic() - started
                soak.checkpoints.append((at, result.pause_s, result.written_bytes, result.records))
                soak.loads.append(os.getloadavg()[0])
                episodes = episodes_before + chaos.job()["finished"]
                for server in read_state(chaos.dir).servers:
                    if not is_running(server):
                        continue
                    seen = proc_status(server.pid)
                    if seen is not None:
                        life = f"{server.name}/{server.pid}"
                        age = at - soak.born.setdefault(life, at)
                        soak.samples[server.name].append(Sample(at, episodes, life, age, *seen))
                say(
                    f"{at:7.0f} s  {cid}: pause {result.pause_s * 1e3:.0f} ms, {result.written_bytes} bytes, "
                    f"{episodes} episodes finished, load {soak.loads[-1]:.1f}"
                )
                if time.monotonic() >= next_kill:
                    wait_published(chaos)
                    t0 = time.perf_counter()
                    chaos.crash_and_restore()
                    soak.restores.append((time.monotonic() - started, time.perf_counter() - t0))
                    soak.trainer.consume(chaos, again=True)
                    say(f"{time.monotonic() - started:7.0f} s  killed every process, restored {chaos.newest}")
                    next_kill = time.monotonic() + args.kill_every
            status = chaos.job()
            soak.trainer.consume(chaos)
            if status["state"] == "completed":
                check_rows(chaos, soak, status["total"])
                say(f"job {job} finished: {status['total']} rollouts")
                episodes_before += status["finished"]
            else:
                say(
                    f"time is up with job {job} running ({status['finished']}/{status['total']}): its rows so far "
                    "are checked for duplicates and errors"
                )
                check_rows(chaos, soak, None)
        ok = True
    finally:
        if chaos is not None:
            with contextlib.suppress(StackError):  # none started yet
                chaos.kill_all()  # every server's process, pass or fail
        story.close()
        problems = soak.lost or soak.duplicated or soak.failed
        if args.workdir is not None:
            print(f"the soak's work folder and every server's log: {tmp}", file=sys.stderr, flush=True)
        elif ok and not problems:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            why = "the soak stopped early" if not ok else "rollouts were lost, duplicated or failed"
            print(f"{why}; its work folder and every server's log are kept in {tmp}", file=sys.stderr, flush=True)


def print_table(soak: Soak, args: argparse.Namespace, elapsed: float) -> None:
    print(
        f"soak: {elapsed / 60:.1f} min of demo collection, a checkpoint every {args.checkpoint_every:g} s, "
        f"every process SIGKILLed and restored every {args.kill_every:g} s; RSS slope after each process's first "
        f"{args.warm_up:g} s; storage "
        f"{args.storage or 'file (temporary folder)'}; "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        f"{'server':>22} {'samples':>7} {'RSS first MB':>12} {'RSS last MB':>11} {'MB/1000 episodes':>16} "
        f"{'lives':>5} {'life ends MB':>13} {'ends MB/1000':>12} {'fds':>9} {'threads':>9}"
    )
    for name, samples in sorted(soak.samples.items()):
        lives: dict[str, list[Sample]] = defaultdict(list)
        for s in samples:
            lives[s.life].append(s)
        warm = {
            life: [(float(s.episodes), s.rss_kib / 1024) for s in ss if s.age >= args.warm_up]
            for life, ss in lives.items()
        }
        # every life's last sample but the running one's (a life ends at a kill)
        ends = [ss[-1] for ss in list(lives.values())[:-1]]
        ends_range = f"{ends[0].rss_kib / 1024:.0f}..{ends[-1].rss_kib / 1024:.0f}" if ends else "-"
        ends_slope = slope_per_1000({"ends": [(float(s.episodes), s.rss_kib / 1024) for s in ends]})
        fds, threads = [s.fds for s in samples], [s.threads for s in samples]
        print(
            f"{name:>22} {len(samples):>7} {samples[0].rss_kib / 1024:>12.1f} {samples[-1].rss_kib / 1024:>11.1f} "
            f"{slope_per_1000(warm):>16.2f} {len(lives):>5} {ends_range:>13} {ends_slope:>12.2f} "
            f"{f'{min(fds)}-{max(fds)}':>9} {f'{min(threads)}-{max(threads)}':>9}"
        )
    if soak.checkpoints:
        pauses = [p for _, p, _, _ in soak.checkpoints]
        sizes = [b for _, _, b, _ in soak.checkpoints]
        per_hour = {"all": [(at / 3.6, p * 1e3) for at, p, _, _ in soak.checkpoints]}
        print(
            f"checkpoints: {len(pauses)}; pause ms first {pauses[0] * 1e3:.0f}, "
            f"median {statistics.median(pauses) * 1e3:.0f}, last {pauses[-1] * 1e3:.0f}, max "
            f"{max(pauses) * 1e3:.0f}, slope {slope_per_1000(per_hour):.1f} ms/hour; "
            f"bytes written first {sizes[0]}, median {statistics.median(sizes):.0f}, last {sizes[-1]}"
        )
    if soak.loads:
        print(
            f"machine load average (1 min) at the checkpoints: min {min(soak.loads):.1f}, "
            f"median {statistics.median(soak.loads):.1f}, max {max(soak.loads):.1f}"
        )
    if soak.restores:
        print(f"kill + restore: {len(soak.restores)}, seconds " + ", ".join(f"{s:.1f}" for _, s in soak.restores))
    print(
        f"rollouts: {soak.rollouts} in {soak.jobs} finished jobs (and the running one); lost {len(soak.lost)}, "
        f"duplicated {len(soak.duplicated)}, failed {len(soak.failed)}"
    )
    print(
        f"token ledger: {soak.trainer.dropped} frozen ledgers dropped by the soak's trainer after the rollout's row "
        f"was written, {len(soak.trainer.refused)} refused; not dropped: "
        + (", ".join(f"{why} {n}" for why, n in sorted(soak.trainer.undropped.items())) or "none")
    )
    for problem in (soak.lost + soak.duplicated + soak.trainer.refused)[:10]:
        print("  ", problem)
    for failure in soak.failed:
        print(f"   failed: job {failure.job}, rollout {failure.rollout_id}: {failure.error}")
        for line in failure.log_lines:
            print(f"      {line[:600]}")
    print(
        "targets: RSS slope <= 1 MB per 1,000 episodes after warm-up; pause, size, fds and threads flat; "
        "0 lost, duplicated or failed rollouts"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3600, help="seconds to soak (default 3600)")
    parser.add_argument("--checkpoint-every", type=float, default=30, help="seconds between checkpoints (default 30)")
    parser.add_argument(
        "--kill-every",
        type=float,
        default=300,
        help="seconds between SIGKILLs of every process, each followed by a restore (default 300)",
    )
    parser.add_argument(
        "--warm-up",
        type=float,
        default=60,
        help="seconds of each process's life left out of its RSS slope (default 60: what an agent keeps of its "
        "finished episodes fills in its first minute)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=100,
        help="rollouts per task: how long one job runs (default 100, ~8 min on 2 cores)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments (default 1)")
    parser.add_argument(
        "--workdir",
        default=None,
        help="run in this folder and keep it (the stacks' state and every server's log); default: a temporary "
        "folder, removed unless the soak stopped early or a rollout was lost, duplicated or failed",
    )
    parser.add_argument("--samples", default=None, help="also write every sample to this file (JSON lines)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    started = time.monotonic()
    soak = Soak()
    stopped: str | None = None
    try:
        run(args, lambda text: print(text, file=sys.stderr, flush=True), soak)
    except Exception as exc:  # the table of what ran so far is still printed, with why it stopped
        stopped = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt:  # Ctrl-C (or kill -INT): the stack is stopped, what ran so far is reported
        stopped = "interrupted"
    print_table(soak, args, time.monotonic() - started)
    if args.samples:
        with open(args.samples, "w", encoding="utf-8") as out:
            for name, samples in sorted(soak.samples.items()):
                for sample in samples:
                    out.write(json.dumps({"server": name, **dataclasses.asdict(sample)}) + "\n")
    if stopped is not None:
        print(f"STOPPED EARLY: {stopped[:2000]}")
    return 0 if not (stopped or soak.lost or soak.duplicated or soak.failed) else 1


if __name__ == "__main__":
    sys.exit(main())
