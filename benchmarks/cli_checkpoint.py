"""``gymckpt checkpoint`` from a cold shell until it says COMPLETED, versus live Workplace sessions, this tree's
CLI beside an earlier revision's in one run (target: <= 1 s at 1,000 sessions).

A real ``workplace_assistant`` uvicorn process holds N live sessions (each after three mutating tool calls). The
CLI is then run as a user runs it, a new process each time (``gymckpt checkpoint --json``), alternately with this
tree's code and, with ``--baseline REV``, with that revision's ``services/`` (extracted by ``git archive`` and put
first on ``PYTHONPATH``), against the same server. Columns:

- wall: from starting the process until it exited, COMPLETED (median and min of ``--runs``);
- CPU: the process's own user + system time (median): on a shared, loaded machine the wall clock mostly measures
  the wait for a core, this does not;
- transaction: the coordinator's own phases (the sum of the result's ``timings``), median;
- start-up: wall minus transaction: the interpreter, the imports, reading the stack's state, finding the
  participants and printing (median);
- imports: ``python -X importtime`` of one more such checkpoint: the time of every import the command made
  (the cumulative times of its top-level imports), and the heaviest packages among them (their own time).

    .venv/bin/python benchmarks/cli_checkpoint.py [--sessions 1000] [--storage file s3] [--runs 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.checkpoint_pause import seed_sessions  # noqa: E402
from tests.support.seaweed import start_seaweed  # noqa: E402

from gym_services.stack.config import ServerSpec, StackConfig  # noqa: E402
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack  # noqa: E402


@dataclass
class Row:
    code: str
    storage: str
    sessions: int
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    transactions: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    imports_ms: float = 0.0
    heaviest: str = ""


def extract(rev: str, into: Path) -> Path:
    """``services/`` of revision ``rev``, extracted under ``into``; the folder to put on PYTHONPATH."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "services"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "services"


def checkpoint_once(services: Path, state_dir: Path, location: str, env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, transaction s) of one ``gymckpt checkpoint`` process run with the code in ``services``."""
    cmd = [str(Path(sys.executable).parent / "gymckpt"), "checkpoint", "--state-dir", str(state_dir)]
    cmd += ["--storage", location, "--json", "--quiet"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env={**env, "PYTHONPATH": str(services)}, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # only this process was waited for meanwhile
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode != 0:
        raise RuntimeError(f"gymckpt checkpoint failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    if result["status"] != "completed":
        raise RuntimeError(f"checkpoint {result['checkpoint_id']}: {result['status']} {result.get('error')}")
    return wall, cpu, sum(result["timings"].values())


def import_profile(services: Path, state_dir: Path, location: str, env: dict[str, str]) -> tuple[float, str]:
    """Ms of every import one ``gymckpt checkpoint`` makes, and its heaviest packages (their own time)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "gym_services.cli", "checkpoint", "--state-dir", str(state_dir)]
    done = subprocess.run(
        [*cmd, "--storage", location, "--quiet"],
        env={**env, "PYTHONPATH": str(services)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the checkpoint under -X importtime failed: {done.stderr[-2000:]}")
    total = 0
    own: Counter[str] = Counter()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative, name = line[len("import time:") :].split("|")
        own[name.strip().split(".")[0]] += int(self_us)
        if not name[1:].startswith(" "):  # top level ("| name", nested "|   name"): counts all under it
            total += int(cumulative)
    top = ", ".join(f"{pkg} {us / 1e3:.0f}" for pkg, us in own.most_common(12) if pkg != "gym_services")
    return total / 1e3, top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000], help="live sessions (default 1000)")
    parser.add_argument("--storage", nargs="+", choices=["file", "s3"], default=["file", "s3"])
    parser.add_argument("--runs", type=int, default=5, help="checkpoints per code version and row (default 5)")
    parser.add_argument("--baseline", help="a git revision whose CLI runs beside this tree's (e.g. main)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-cli-bench-"))
    codes: list[tuple[str, Path]] = [("this tree", ROOT / "services")]
    if args.baseline:
        codes.insert(0, (f"{args.baseline}", extract(args.baseline, tmp / "baseline")))
    s3 = start_seaweed(tmp / "seaweed") if "s3" in args.storage else None
    env = dict(os.environ)
    if s3 is not None:
        s3.create_bucket("bench")
        env.update(s3.env())  # the server and the CLI reach SeaweedFS through AWS_*
        os.environ.update(s3.env())
    rows: list[Row] = []
    try:
        for n in args.sessions:
            for backend in args.storage:
                rows += measure(n, backend, codes, args.runs, tmp, env)
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(rows, args)


def measure(n: int, backend: str, codes, runs: int, tmp: Path, env: dict[str, str]) -> list[Row]:
    state_dir = tmp / f"stack-{backend}-{n}"
    stack = StackConfig(
        name="clibench", state_dir=str(state_dir), servers={"workplace": ServerSpec(server="workplace_assistant")}
    )
    stack_secrets(state_dir)
    location = f"file://{tmp / 'store' / f'n{n}'}" if backend == "file" else f"s3://bench/cli-n{n}"
    state = start_stack(stack, tmp, ready_timeout_s=120)
    rows = [Row(code, backend, n) for code, _ in codes]
    try:
        asyncio.run(seed_sessions(state.servers[0].url, n))
        for row, (_, services) in zip(rows, codes, strict=True):
            row.imports_ms, row.heaviest = import_profile(services, state_dir, location, env)
        for i in range(runs):
            order = list(zip(rows, codes, strict=True))
            for row, (_, services) in order if i % 2 == 0 else reversed(order):  # alternate who goes first
                row.loads.append(os.getloadavg()[0])
                wall, cpu, transaction = checkpoint_once(services, state_dir, location, env)
                row.walls.append(wall)
                row.cpus.append(cpu)
                row.transactions.append(transaction)
                print(
                    f"  {row.code} {backend} {n}: {wall:.3f} s, CPU {cpu:.3f} s, transaction {transaction:.3f} s",
                    file=sys.stderr,
                )
    finally:
        stop_stack(state_dir, kill=True)
    return rows


def print_table(rows: list[Row], args) -> None:
    print(
        f"`gymckpt checkpoint` from a cold shell to COMPLETED, {args.runs} runs per row, one-server stack of N live "
        "Workplace sessions"
    )
    print(
        f"{'code':>12} {'storage':>7} {'sessions':>8} {'wall s (median)':>15} {'wall s (min)':>12} {'CPU s':>6} "
        f"{'transaction s':>13} {'start-up s':>10} {'imports ms':>10} {'load':>9}  heaviest imports (ms)"
    )
    for r in rows:
        startup = statistics.median(w - t for w, t in zip(r.walls, r.transactions, strict=True))
        print(
            f"{r.code:>12} {r.storage:>7} {r.sessions:>8} {statistics.median(r.walls):>15.3f} {min(r.walls):>12.3f} "
            f"{statistics.median(r.cpus):>6.3f} {statistics.median(r.transactions):>13.3f} {startup:>10.3f} "
            f"{r.imports_ms:>10.0f} "
            f"{f'{min(r.loads):.1f}-{max(r.loads):.1f}':>9}  {r.heaviest}"
        )
    print()
    print("target: wall <= 1 s at 1,000 sessions (on an idle machine: compare the CPU column)")


if __name__ == "__main__":
    main()
