"""Held memory: what every server of the demo stack keeps per finished episode, and where.

The demo stack collects (the tasks of all four environments, ``--repeats`` rollouts per task); every
``--drop-every`` seconds the rollouts finished so far have their token ledgers frozen and dropped, as a
trainer reading the rows as they are written does, and every ``--checkpoint-every`` seconds a ``background``
checkpoint is taken. Every server process loads a probe (a ``sitecustomize`` this
script writes; nothing in the servers' code): on ``SIGUSR1`` it writes its resident memory, what Python's
allocator holds (``tracemalloc``, in the servers named by ``--trace``), malloc's arenas (``mallinfo2``: in use,
free but kept, mapped), Python's small-object allocator's arenas (``sys._debugmallocstats``: their size, and what
of it no object uses) and its live objects by type (after a full collection). The probe runs right after the
checkpoint at which ``--warm-up`` episodes have finished, and again after ``--episodes`` more; nothing is killed.

The table, per server: the growth between the two probes per 1,000 finished episodes - resident memory, Python's
traced memory, malloc's bytes in use and free-but-kept, the small-object arenas and their unused part - and the
object types and allocation sites that grew most. Then the checkpoints: bytes written and records per participant,
first and last, and their growth per 1,000 episodes.

    .venv/bin/python benchmarks/held_memory.py [--warm-up 300] [--episodes 1000] [--checkpoint-every 30]
        [--drop-every 5] [--trace agent-workplace,collection,workplace-assistant] [--frames 1] [--top 8]
        [--agents agent-workplace --turns 300 --repeats 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import Chaos  # noqa: E402
from benchmarks.soak import Trainer  # noqa: E402

from gym_services.demo.story import Run, Story  # noqa: E402
from gym_services.stack.launcher import StackError, is_running, read_state  # noqa: E402

#: loaded by every server process (PYTHONPATH): SIGUSR1 writes what the process holds
PROBE = r"""
import os

_DIR = os.environ.get("GYMCKPT_HEAP_PROBE")
if _DIR:
    import signal
    import tracemalloc

    _NAME = os.environ.get("GYMCKPT_PARTICIPANT_ID", "")
    if _NAME and _NAME in os.environ.get("GYMCKPT_HEAP_TRACE", "").split(","):
        tracemalloc.start(int(os.environ.get("GYMCKPT_HEAP_FRAMES", "1")))

    def _probe(signum, frame):
        import collections
        import ctypes
        import gc
        import json
        import sys

        gc.collect()
        counts = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
        status = dict(
            line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
        )
        fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                  "keepcost")

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in fields]

        malloc = {}
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = MallInfo2
            info = libc.mallinfo2()
            malloc = {name: getattr(info, name) for name in fields}
        except (OSError, AttributeError):
            pass
        pymalloc = {}
        stats_path = os.path.join(_DIR, f"stats-{os.getpid()}")
        saved = os.dup(2)  # Python's small-object allocator reports its arenas on the C stderr only
        try:
            with open(stats_path, "w") as fh:
                os.dup2(fh.fileno(), 2)
                sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        with open(stats_path) as fh:
            for line in fh:
                if "bytes/arena" in line:  # "<n> arenas * <size> bytes/arena = <total>"
                    pymalloc["arenas"] = int(line.rsplit("=", 1)[1].replace(",", ""))
                elif line.startswith("# bytes in allocated blocks"):
                    pymalloc["allocated"] = int(line.rsplit("=", 1)[1].replace(",", ""))
        os.remove(stats_path)
        trimmed = None
        if os.environ.get("GYMCKPT_HEAP_TRIM") and malloc:  # what malloc keeps freed, given back: what is left
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/status") as fh:
                after = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
            trimmed = int(after["VmRSS"].split()[0])
        with open(os.path.join(_DIR, "tag")) as fh:
            tag = fh.read().strip()
        path = os.path.join(_DIR, f"{_NAME or 'process'}-{os.getpid()}-{tag}")
        traced = None
        if tracemalloc.is_tracing():
            traced = tracemalloc.get_traced_memory()[0]
            tracemalloc.take_snapshot().dump(path + ".trace")
        with open(path + ".tmp", "w") as fh:
            json.dump(
                {
                    "rss_kib": int(status["VmRSS"].split()[0]),
                    "trimmed_rss_kib": trimmed,
                    "threads": int(status["Threads"]),
                    "traced": traced,
                    "malloc": malloc,
                    "pymalloc": pymalloc,
                    "objects": dict(counts),
                },
                fh,
            )
        os.replace(path + ".tmp", path + ".json")

    signal.signal(signal.SIGUSR1, _probe)
"""


@dataclass
class Probe:
    episodes: int
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the probe's JSON
    traces: dict[str, Path] = field(default_factory=dict)  # name -> tracemalloc snapshot
    live: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> gym_live{kind}


@dataclass
class Checkpointed:
    episodes: int
    written_bytes: int
    records: int
    participants: dict[str, tuple[int, int]]  # participant -> (records, bytes)


def live_counts(url: str) -> dict[str, float]:
    """The server's ``gym_live`` gauges (what its participant holds, by kind)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gym_live{"):
            labels, value = line[len("gym_live{") :].rsplit("} ", 1)
            kind = dict(part.split("=", 1) for part in labels.split(","))["kind"].strip('"')
            out[kind] = float(value)
    return out


def probe(chaos: Chaos, probe_dir: Path, tag: str, episodes: int, timeout_s: float = 120) -> Probe:
    """SIGUSR1 to every running server; waits for each one's answer."""
    (probe_dir / "tag").write_text(tag)
    servers = [s for s in read_state(chaos.dir).servers if is_running(s)]
    for server in servers:
        os.kill(server.pid, signal.SIGUSR1)
    found = Probe(episodes)
    deadline = time.monotonic() + timeout_s
    for server in servers:
        path = probe_dir / f"{server.name}-{server.pid}-{tag}.json"
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{server.name} did not answer the probe in {timeout_s:.0f} s")
            time.sleep(0.2)
        found.servers[server.name] = json.loads(path.read_text())
        trace = path.with_suffix(".trace")
        if trace.exists():
            found.traces[server.name] = trace
        found.live[server.name] = live_counts(server.url)
    return found


def checkpoint(chaos: Chaos, trainer: Trainer) -> tuple[int, Checkpointed]:
    """The trainer drops what finished, then a background checkpoint; (episodes finished, what it wrote)."""
    trainer.consume(chaos)
    cid = chaos.next_id()
    for attempt in range(5):  # on a loaded machine a server may take longer than discovery waits
        try:
            result = asyncio.run(chaos._checkpoint(cid))
            break
        except StackError:
            if attempt == 4:
                raise
            time.sleep(2)
    if result.status != "completed":
        raise AssertionError(f"checkpoint {cid} failed: {result.error}")
    chaos.taken.append(cid)
    episodes = chaos.job()["finished"]
    parts = {p.participant_id: (p.records, p.bytes) for p in result.participants}
    return episodes, Checkpointed(episodes, result.written_bytes, result.records, parts)


def per_1000(delta: float, episodes: int) -> float:
    return delta / episodes * 1000 if episodes else float("nan")


def report(a: Probe, b: Probe, checkpoints: list[Checkpointed], trainer: Trainer, args: argparse.Namespace) -> None:
    n = b.episodes - a.episodes
    mib = 1024 * 1024
    print(
        f"held memory: {n} episodes finished between the probes (after {a.episodes} of warm-up), a checkpoint every "
        f"{args.checkpoint_every:g} s, ledgers dropped every {args.drop_every:g} s; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        f"trainer: {len(trainer.consumed)} rows read, {trainer.dropped} ledgers dropped, {len(trainer.refused)} "
        "refused (tried again), not dropped: "
        + (", ".join(f"{why} {count}" for why, count in sorted(trainer.undropped.items())) or "none")
    )
    print("growth per 1,000 finished episodes (MB):")
    print(
        f"{'server':>26} {'RSS MB':>7} {'RSS':>7} {'traced':>7} {'malloc used':>11} {'malloc free':>11} "
        f"{'mmapped':>8} {'pymalloc':>8} {'its free':>8} {'threads':>8} {'trimmed MB':>10}"
    )
    for name in sorted(b.servers):
        if name not in a.servers:
            continue
        x, y = a.servers[name], b.servers[name]
        rss = per_1000((y["rss_kib"] - x["rss_kib"]) / 1024, n)
        traced = per_1000((y["traced"] - x["traced"]) / mib, n) if x["traced"] is not None else None
        mx, my = x["malloc"], y["malloc"]
        used = per_1000((my.get("uordblks", 0) - mx.get("uordblks", 0)) / mib, n)
        free = per_1000((my.get("fordblks", 0) - mx.get("fordblks", 0)) / mib, n)
        mapped = per_1000((my.get("hblkhd", 0) - mx.get("hblkhd", 0)) / mib, n)
        px, py = x.get("pymalloc", {}), y.get("pymalloc", {})
        arenas = per_1000((py.get("arenas", 0) - px.get("arenas", 0)) / mib, n)
        spare = per_1000(
            (py.get("arenas", 0) - py.get("allocated", 0) - px.get("arenas", 0) + px.get("allocated", 0)) / mib, n
        )
        threads = f"{x['threads']}-{y['threads']}"
        trimmed = (
            f"{x['trimmed_rss_kib'] / 1024:.0f}->{y['trimmed_rss_kib'] / 1024:.0f}"
            if x.get("trimmed_rss_kib") and y.get("trimmed_rss_kib")
            else "-"
        )
        print(
            f"{name:>26} {y['rss_kib'] / 1024:>7.1f} {rss:>7.2f} {'-' if traced is None else f'{traced:.2f}':>7} "
            f"{used:>11.2f} {free:>11.2f} {mapped:>8.2f} {arenas:>8.2f} {spare:>8.2f} {threads:>8} {trimmed:>10}"
        )
    print("objects that grew most (count per 1,000 episodes), live counts (gym_live) at the two probes:")
    for name in sorted(b.servers):
        if name not in a.servers:
            continue
        x, y = a.servers[name]["objects"], b.servers[name]["objects"]
        grown = sorted(((y.get(t, 0) - x.get(t, 0), t) for t in set(x) | set(y)), reverse=True)[: args.top]
        shown = ", ".join(f"{t.rsplit('.', 1)[-1]} {per_1000(d, n):+.0f}" for d, t in grown if d > 0)
        live = {k: (a.live.get(name, {}).get(k), v) for k, v in b.live.get(name, {}).items()}
        changed = ", ".join(f"{k} {int(u or 0)}->{int(v)}" for k, (u, v) in sorted(live.items()) if u != v)
        print(f"  {name}: {shown or 'nothing grew'}" + (f"; live: {changed}" if changed else ""))
    for name in sorted(b.traces):
        if name not in a.traces:
            continue
        before = tracemalloc.Snapshot.load(str(a.traces[name]))
        after = tracemalloc.Snapshot.load(str(b.traces[name]))
        diffs = after.compare_to(before, "lineno")[: args.top]
        print(f"  {name}: allocation sites that grew most (KB per 1,000 episodes, blocks):")
        for d in diffs:
            frame = d.traceback[0]
            where = f"{frame.filename.split('site-packages/')[-1].split('services/')[-1]}:{frame.lineno}"
            print(f"    {per_1000(d.size_diff / 1024, n):>9.1f} KB {per_1000(d.count_diff, n):>+9.0f}  {where}")
    if len(checkpoints) >= 2:
        first, last = checkpoints[0], checkpoints[-1]
        span = last.episodes - first.episodes
        print(
            f"checkpoints: {len(checkpoints)}, at {first.episodes} .. {last.episodes} episodes; bytes written first "
            f"{first.written_bytes}, last {last.written_bytes} "
            f"({per_1000(last.written_bytes - first.written_bytes, span):+.0f} "
            f"per 1,000 episodes); records first {first.records}, last {last.records}"
        )
        print(
            "  each checkpoint (episodes: bytes written, records of "
            + ", ".join(sorted(last.participants))
            + "):\n    "
            + "\n    ".join(
                f"{c.episodes}: {c.written_bytes} B, "
                + " ".join(str(c.participants.get(pid, (0, 0))[0]) for pid in sorted(last.participants))
                for c in checkpoints
            )
        )
        for pid in sorted(last.participants):
            r0, b0 = first.participants.get(pid, (0, 0))
            r1, b1 = last.participants[pid]
            print(
                f"  {pid:>26}: records {r0} -> {r1} ({per_1000(r1 - r0, span):+.0f}/1,000 episodes), "
                f"bytes {b0} -> {b1} ({per_1000(b1 - b0, span):+.0f}/1,000 episodes)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm-up", type=int, default=300, help="episodes finished before the first probe")
    parser.add_argument("--episodes", type=int, default=1000, help="episodes finished between the two probes")
    parser.add_argument("--checkpoint-every", type=float, default=30, help="seconds between checkpoints")
    parser.add_argument(
        "--drop-every",
        type=float,
        default=5,
        help="seconds between the trainer's rounds of freezing and dropping the finished rollouts' ledgers "
        "(one more before each checkpoint)",
    )
    parser.add_argument("--repeats", type=int, default=100, help="rollouts per task (the job must outlast the probes)")
    parser.add_argument("--tokens-per-second", type=float, default=120.0)
    parser.add_argument(
        "--trace",
        default="agent-workplace,collection,workplace-assistant",
        help="servers whose Python allocations tracemalloc follows (slower); '' for none",
    )
    parser.add_argument("--frames", type=int, default=1, help="frames tracemalloc keeps per allocation")
    parser.add_argument("--top", type=int, default=8, help="object types and allocation sites shown per server")
    parser.add_argument(
        "--agents",
        default="",
        help="only the tasks of these agents (comma-separated, e.g. agent-workplace); default: every environment's "
        "(the job runs them task by task, so one environment at a time)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="list the tasks this many times over, each turn --repeats rollouts of one task (the collection runs a "
        "job task by task): with many short turns every stretch of the job has the same mix of tasks, so a later "
        "task's larger episodes do not read as growth between the probes",
    )
    parser.add_argument(
        "--trim",
        action="store_true",
        help="each probe also calls malloc_trim(0) and reads the resident memory again (the column 'trimmed'): "
        "what malloc kept of the memory Python freed is then given back",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-held-"))
    probe_dir = tmp / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(probe_dir), os.environ.get("PYTHONPATH")) if p)
    os.environ["GYMCKPT_HEAP_PROBE"] = str(probe_dir)
    os.environ["GYMCKPT_HEAP_TRACE"] = args.trace
    os.environ["GYMCKPT_HEAP_FRAMES"] = str(args.frames)
    if args.trim:
        os.environ["GYMCKPT_HEAP_TRIM"] = "1"
    story = Story(
        tmp / "story", repeats=args.repeats, tokens_per_second=args.tokens_per_second, timeout_s=600, say=lambda t: None
    )
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    ok = False
    started = time.monotonic()
    try:
        story.prepare()
        rows = story.tasks
        if args.agents:
            agents = set(args.agents.split(","))
            rows = [row for row in rows if row["agent"] in agents]
            if not rows:
                raise SystemExit(f"no task of {args.agents}")
        story.tasks = rows * max(1, args.turns)
        story.tasks_path.write_text("".join(json.dumps(row) + "\n" for row in story.tasks))
        chaos = Chaos(story, Run(), random.Random(1), "a", say=say)
        chaos.use_stack(1)
        chaos.start()
        trainer = Trainer()
        story.submit(chaos.state, chaos.output)
        first: Probe | None = None
        checkpoints: list[Checkpointed] = []
        while True:
            if time.monotonic() - started > args.timeout:
                raise AssertionError(f"not done in {args.timeout:.0f} s: {chaos.job()}")
            until = time.monotonic() + args.checkpoint_every
            while (left := until - time.monotonic()) > 0:
                time.sleep(min(args.drop_every, left))
                trainer.consume(chaos)
            episodes, written = checkpoint(chaos, trainer)
            job = chaos.job()
            say(f"{time.monotonic() - started:6.0f} s: {episodes} episodes, checkpoint wrote {written.written_bytes} B")
            if job["state"] == "completed":
                raise AssertionError("the job completed before the last probe: raise --repeats")
            if first is None:
                if episodes >= args.warm_up:
                    first = probe(chaos, probe_dir, "a", episodes)
                    checkpoints.append(written)
                    say(f"probe a at {episodes} episodes")
                continue
            checkpoints.append(written)
            if episodes >= first.episodes + args.episodes:
                last = probe(chaos, probe_dir, "b", episodes)
                say(f"probe b at {episodes} episodes")
                break
        report(first, last, checkpoints, trainer, args)
        chaos.kill_all()
        ok = True
    finally:
        with_stack = locals().get("chaos")
        if with_stack is not None and not ok:
            with_stack.kill_all()
        story.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"held_memory failed; its work folder and logs are kept in {tmp}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
