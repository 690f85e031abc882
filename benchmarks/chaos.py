"""Chaos: rollout collection over every environment while processes are SIGKILLed at random moments; at the end
the results must equal an uninterrupted run's (``docs/architecture.md``, "Targets").

The demo stack (every server its own process, the tasks of all four environments) collects rollouts. At random
moments (a random share of the rollouts finished, the rest in flight) one cycle of a random kind runs:

- ``a``: checkpoint -> SIGKILL every process -> fresh processes -> restore that checkpoint;
- ``b``: checkpoint, with one random process (participant or not) SIGKILLed at a random step of it -> SIGKILL every
  process -> fresh processes -> restore the newest complete checkpoint (restorable only once its global manifest
  exists: a checkpoint whose manifest was never published is never restored; a job without one takes one first);
- ``c``: a checkpoint by ``gymckpt checkpoint`` in its own process, SIGKILLed mid-transaction -> every participant
  must reopen admission within its lease, and collection carries on;
- ``d``: the inference worker SIGKILLed mid-generation and restarted: the policy model retries, collection carries
  on;
- ``e`` (``--storage embedded-s3`` only, where this script owns the S3 server): S3 stopped while a checkpoint writes
  (the persist of a sync checkpoint under the pause or of a background one after resume, or the publication) - its
  SeaweedFS SIGSTOPped, or SIGKILLed and started again on the same ports and data - for a random while. The checkpoint
  completes (published) or fails (never published, not even later), the pause ends within its bound (admission reopens
  everywhere), collection carries on, and once S3 is back the next checkpoint completes and is restored (as in ``a``).

At the end, compared with an uninterrupted run of the same tasks: every (task, repeat) exactly once, every reward
equal, every result's training tokens (prompt ids, generated ids, log-probs) equal, no error rows, the results
file valid JSONL. Storage is ``file://`` (default) or S3 (``--s3-endpoint``, keys from the AWS_* variables).

    .venv/bin/python benchmarks/chaos.py [--cycles 50] [--kinds abcd(e)] [--seed 1]
        [--storage embedded-s3|s3://bucket/prefix]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gym_services.base.config import StorageConfig
from gym_services.control.protocol import CheckpointMethod
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionPhase
from gym_services.demo.report import training_tokens
from gym_services.demo.story import Run, Story
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import StackState, is_running, read_state, restart_server, stack_secrets, stop_stack
from gym_services.stack.objectstore import read_store, start_local_s3

WORKER = "inference-worker"
KINDS = "abcde"
#: the kinds that need this script to own the S3 server (``--storage embedded-s3``)
S3_KINDS = "e"


class S3Outage:
    """The story's local S3 (SeaweedFS) made unavailable from :meth:`begin` for ``outage_s``, then back: ``stop``
    SIGSTOPs its process group (requests hang) and SIGCONTs it; ``kill`` SIGKILLs it (connections refused) and
    starts it again on the same ports and data. :meth:`end` waits until it answers again."""

    def __init__(self, story: Story, how: str, outage_s: float) -> None:
        self.story, self.how, self.outage_s = story, how, outage_s
        self.data_dir = story.workdir / "s3"
        self.began: float | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def begin(self) -> None:
        if self.began is not None:
            return
        store = read_store(self.data_dir)
        assert store is not None, "no local S3 to stop"
        self.began = time.monotonic()
        os.killpg(store.pid, signal.SIGSTOP if self.how == "stop" else signal.SIGKILL)
        self._thread = threading.Thread(target=self._back, args=(store.pid,), name="s3-outage", daemon=True)
        self._thread.start()

    def _back(self, pid: int) -> None:
        try:
            time.sleep(self.outage_s)
            if self.how == "stop":
                os.killpg(pid, signal.SIGCONT)
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            env = self.story.server_env
            start_local_s3(
                self.data_dir, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], same_ports=True, timeout_s=120
            )  # a stopped one: waits until it answers; a killed one: started again
        except BaseException as exc:
            self.error = exc

    def end(self) -> None:
        """S3 is back (a no-op when the outage never began)."""
        if self._thread is not None:
            self._thread.join(timeout=180)
            if self._thread.is_alive() or self.error is not None:
                raise AssertionError(f"S3 did not come back after the outage: {self.error!r}")


@dataclass
class Outcome:
    cycles: Counter = field(default_factory=Counter)
    rollouts: int = 0
    differences: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    invalid_lines: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.differences or self.duplicates or self.missing or self.errors or self.invalid_lines)

    def table(self, label: str) -> str:
        kinds = " ".join(f"{k}={self.cycles[k]}" for k in KINDS)
        head = [
            "storage",
            "cycles",
            "by kind",
            "rollouts",
            "differences",
            "duplicates",
            "missing",
            "errors",
            "bad lines",
        ]
        row = [
            label,
            str(sum(self.cycles.values())),
            kinds,
            str(self.rollouts),
            str(len(self.differences)),
            str(len(self.duplicates)),
            str(len(self.missing)),
            str(len(self.errors)),
            str(self.invalid_lines),
        ]
        widths = [max(len(h), len(r)) for h, r in zip(head, row, strict=True)]
        line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
        return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", line(row)])


class Chaos:
    """One collection job carried through ``cycles`` random faults."""

    def __init__(
        self, story: Story, base: Run, rng: random.Random, kinds: str = "abcd", *, order: str | None = None, say=print
    ) -> None:
        """``order``: the kinds of the cycles in this order (a short CI run covers each), else drawn from ``kinds``."""
        self.story, self.base, self.rng, self.kinds, self.order, self.say = story, base, rng, kinds, order, say
        self.jobs = 0
        self.use_stack(1)
        self.newest: str | None = None  # the newest checkpoint whose global manifest exists
        self.taken: list[str] = []  # every checkpoint of this job that may yet be published (in the background)
        self.outcome = Outcome()
        self.serial = 0

    # --- the stack ----------------------------------------------------------------------------

    def use_stack(self, job: int) -> None:
        """Job ``job`` runs on its own stack with its own results file (a job is never submitted twice to one
        collection server)."""
        self.jobs = job
        self.name = f"chaos-{job}"
        self.dir = self.story.workdir / self.name
        self.output = self.story.workdir / f"{self.name}.jsonl"

    def start(self) -> StackState:
        self.state = self.story.start(self.name)
        self.token = stack_secrets(self.dir)["control_token"]
        return self.state

    def job(self) -> dict[str, Any]:
        return httpx.get(
            f"{self.state.url('collection')}/jobs/current",
            headers={"authorization": f"Bearer {self.token}"},
            timeout=30,
        ).json()

    def kill_all(self) -> None:
        stop_stack(self.dir, kill=True)

    def kill(self, name: str) -> None:
        server = next(s for s in read_state(self.dir).servers if s.name == name)
        if not is_running(server):
            return  # died already: its pid may be someone else's by now
        pid = server.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def published(self, checkpoint_id: str) -> bool:
        return CheckpointStore(open_storage(self.story.storage, self.story.storage_config)).is_published(checkpoint_id)

    # --- waiting --------------------------------------------------------------------------------

    def wait_for_a_moment(self, timeout_s: float = 300) -> bool:
        """Until a random share of what is left has finished with episodes in flight; False once the job is done."""
        start = self.job()
        left = start["total"] - start["finished"]
        target = start["finished"] + self.rng.randint(0, max(0, left // 3))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job()
            if job["state"] == "completed":
                return False
            if job["finished"] >= target and job["live"]:
                time.sleep(self.rng.uniform(0, 0.3))
                return True
            time.sleep(0.02)
        raise AssertionError(f"no progress in {timeout_s}s: {self.job()}")

    # --- the kinds ---------------------------------------------------------------------------------

    async def _checkpoint(
        self, checkpoint_id: str, on_phase=None, method: CheckpointMethod = CheckpointMethod.BACKGROUND
    ):
        async with ControlClient(self.token, timeout_s=120) as client:
            participants = await discover(self.state, client)

            async def on_event(phase: TransactionPhase, detail: dict[str, Any]) -> None:
                if on_phase is not None:
                    await on_phase(phase)

            coordinator = Coordinator(participants, client, storage_config=self.story.storage_config, on_event=on_event)
            return await coordinator.checkpoint(
                checkpoint_id, self.story.storage, prepare_timeout_s=60, lease_s=30, method=method
            )

    async def _restore(self, checkpoint_id: str):
        async with ControlClient(self.token, timeout_s=120) as client:
            participants = await discover(self.state, client)
            coordinator = Coordinator(participants, client, storage_config=self.story.storage_config)
            return await coordinator.restore(checkpoint_id, self.story.storage, lease_s=30)

    def next_id(self) -> str:
        self.serial += 1
        return f"chaos-{self.serial:03d}"

    def crash_and_restore(self) -> None:
        """Collection runs on for a random while after the checkpoint (results past its offset are written, to be
        cut by the restore and run again), then every process is SIGKILLed and the newest complete checkpoint
        restored into fresh ones."""
        time.sleep(self.rng.uniform(0.3, 2.0))
        self.kill_all()
        # nothing is published after the crash: the newest checkpoint with a global manifest is the one to restore
        self.newest = next((c for c in reversed(self.taken) if self.published(c)), self.newest)
        self.start()
        if self.newest is None:
            raise AssertionError("no complete checkpoint to restore")
        result = asyncio.run(self._restore(self.newest))
        if result.status != "completed":
            raise AssertionError(f"restore of {self.newest} failed: {result.error}\n{self.log_tails()}")

    def checkpoint_published(self) -> str:
        """A checkpoint that completes and is published."""
        checkpoint_id = self.next_id()
        result = asyncio.run(self._checkpoint(checkpoint_id))
        if result.status != "completed":
            raise AssertionError(f"checkpoint {checkpoint_id} failed: {result.error}")
        self.taken.append(checkpoint_id)
        deadline = time.monotonic() + 120  # completed; its upload may still run in the background until published
        while not self.published(checkpoint_id):
            if time.monotonic() > deadline:
                raise AssertionError(f"checkpoint {checkpoint_id} completed but was not published in 120 s")
            time.sleep(0.05)
        self.newest = checkpoint_id
        return checkpoint_id

    def cycle_a(self) -> None:
        self.checkpoint_published()
        self.crash_and_restore()

    def cycle_b(self) -> None:
        if self.newest is None:  # the crash restores the newest complete checkpoint: the job needs one first
            self.checkpoint_published()
        checkpoint_id = self.next_id()
        phases = [
            TransactionPhase.PREPARING,
            TransactionPhase.CAPTURING,
            TransactionPhase.PERSISTING,
            TransactionPhase.PUBLISHING,
            TransactionPhase.RESUMING,
        ]
        at = self.rng.choice(phases)
        victim = self.rng.choice([s.name for s in self.state.servers])

        async def on_phase(phase: TransactionPhase) -> None:
            if phase is at:
                self.kill(victim)

        result = asyncio.run(self._checkpoint(checkpoint_id, on_phase))
        self.taken.append(checkpoint_id)  # restorable only once its global manifest exists (checked at the crash)
        self.outcome.notes.append(f"b: killed {victim} at {at.value}: checkpoint {result.status}")
        self.crash_and_restore()

    def cycle_c(self) -> None:
        """The coordinator (``gymckpt checkpoint``, its own process) SIGKILLed mid-transaction."""
        checkpoint_id = self.next_id()
        lease_s = 3
        env = {**os.environ, **self.story.server_env}
        cmd = [
            sys.executable,
            "-m",
            "gym_services.cli",
            "checkpoint",
            "--state-dir",
            str(self.dir),
            "--id",
            checkpoint_id,
            "--storage",
            self.story.storage,
            "--lease",
            str(lease_s),
            "--prepare-timeout",
            "60",
        ]
        if self.story.storage_config.endpoint_url:
            cmd += ["--s3-endpoint", self.story.storage_config.endpoint_url]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 60
            while not any(not s.get("admission_open", True) for s in self.statuses().values()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break  # it finished (or never paused anyone) before the kill: still a valid cycle
                time.sleep(0.01)
            time.sleep(self.rng.uniform(0, 0.5))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        killed_at = time.monotonic()
        while True:  # every participant reopens within its lease (and the lease check interval)
            closed = [n for n, s in self.statuses().items() if not s.get("admission_open", True)]
            if not closed:
                break
            if time.monotonic() - killed_at > lease_s + 10:
                raise AssertionError(f"still paused {lease_s + 10}s after the coordinator died: {closed}")
            time.sleep(0.05)
        self.taken.append(checkpoint_id)

    def cycle_d(self) -> None:
        """The inference worker SIGKILLed mid-generation, then restarted."""
        self.kill(WORKER)
        time.sleep(self.rng.uniform(0, 1.0))
        restart_server(self.dir, WORKER, ready_timeout_s=120)
        self.state = read_state(self.dir)

    def cycle_e(
        self,
        how: str | None = None,
        method: CheckpointMethod | None = None,
        at: TransactionPhase | None = None,
        outage_s: float | None = None,
    ) -> None:
        """S3 unavailable while a checkpoint writes, back after a random while: the checkpoint completes or is
        never published, the pause ends within its bound, and the next checkpoint (S3 back) is restored."""
        if not self.story.embedded_s3:
            raise AssertionError("kind e stops the local S3 server: run with --storage embedded-s3")
        checkpoint_id = self.next_id()
        method = method or self.rng.choice([CheckpointMethod.BACKGROUND, CheckpointMethod.SYNC])
        writes = {
            CheckpointMethod.SYNC: [TransactionPhase.PERSISTING, TransactionPhase.PUBLISHING],
            CheckpointMethod.BACKGROUND: [
                TransactionPhase.RESUMING,
                TransactionPhase.PERSISTING,
                TransactionPhase.PUBLISHING,
            ],
        }
        at = at or self.rng.choice(writes[method])
        outage = S3Outage(
            self.story,
            how or self.rng.choice(["stop", "kill"]),
            self.rng.uniform(0.5, 6.0) if outage_s is None else outage_s,
        )

        async def on_phase(phase: TransactionPhase) -> None:
            if phase is at:
                outage.begin()

        try:
            started = time.monotonic()
            result = asyncio.run(self._checkpoint(checkpoint_id, on_phase, method))
            took = time.monotonic() - started
        finally:
            outage.end()
        note = (
            f"e: S3 {outage.how} for {outage.outage_s:.1f}s at {at.value} ({method.value}): checkpoint "
            f"{result.status} in {took:.1f}s" + (f" ({str(result.error)[:120]})" if result.error else "")
        )
        self.outcome.notes.append(note)
        self.say("  " + note)
        # the pause ended with the transaction (it resumes or aborts everyone it paused): admission is open everywhere
        # now, not a lease later
        self.wait_reopened(10, f"checkpoint {checkpoint_id} ended")
        if result.status == "completed":
            if not self.published(checkpoint_id):
                raise AssertionError(f"checkpoint {checkpoint_id} completed but has no global manifest")
            self.taken.append(checkpoint_id)
            self.newest = checkpoint_id
        else:  # never published, not even by a background upload finishing later
            time.sleep(1.0)
            if self.published(checkpoint_id):
                raise AssertionError(f"checkpoint {checkpoint_id} failed ({result.error}) but was published")
        # collection carried on, S3 is back: the next checkpoint completes and is restored into fresh processes
        self.cycle_a()

    def wait_reopened(self, bound_s: float, what: str) -> None:
        since = time.monotonic()
        while True:
            closed = [n for n, s in self.statuses().items() if not s.get("admission_open", True)]
            if not closed:
                return
            if time.monotonic() - since > bound_s:
                raise AssertionError(f"still paused {bound_s:.0f}s after {what}: {closed}")
            time.sleep(0.05)

    def log_tails(self, chars: int = 1500) -> str:
        """The end of every server's log (kept with the work folder when a run fails)."""
        tails = []
        for server in read_state(self.dir).servers:
            with contextlib.suppress(OSError):
                tails.append(f"--- {server.log}\n{Path(server.log).read_text(errors='replace')[-chars:]}")
        return "\n".join(tails)

    def statuses(self) -> dict[str, dict]:
        out = {}
        for server in read_state(self.dir).servers:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = httpx.get(
                    f"{server.url}/ng-control/v1/checkpoint/status",
                    headers={"authorization": f"Bearer {self.token}"},
                    timeout=10,
                )
                if answer.status_code == 200:
                    out[server.name] = answer.json()
        return out

    # --- the run ---------------------------------------------------------------------------------

    def run(self, cycles: int, timeout_s: float = 600) -> Run:
        """Collect while running ``cycles`` faults; when a job finishes first, the next one runs on a fresh stack
        until every cycle ran."""
        done = 0
        try:
            while done < cycles:
                if self.jobs and hasattr(self, "state"):
                    stop_stack(self.dir, kill=True)
                    self.use_stack(self.jobs + 1)
                self.start()
                self.newest, self.taken = None, []
                self.story.submit(self.state, self.output)
                while done < cycles and self.wait_for_a_moment():
                    kind = self.order[done % len(self.order)] if self.order else self.rng.choice(self.kinds)
                    self.say(f"cycle {done + 1}/{cycles}: {kind}")
                    getattr(self, f"cycle_{kind}")()
                    job = self.job()
                    self.say(
                        f"  after {kind}: finished {job['finished']} live {job['live']} state {job['state']} lines "
                        f"{len(self.output.read_text().splitlines()) if self.output.exists() else 0}"
                    )
                    self.outcome.cycles[kind] += 1
                    done += 1
                if done < cycles:
                    self.finish(timeout_s)
                    self.check(final=False)
            self.finish(timeout_s)
            return self.check(final=True)
        finally:
            stop_stack(self.dir, kill=True)

    def finish(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.job()["state"] != "completed":
            if time.monotonic() > deadline:
                raise AssertionError(f"the job did not finish in {timeout_s}s: {self.job()}")
            time.sleep(0.05)

    def check(self, final: bool) -> Run:
        run = Run()
        valid = []
        for line in self.output.read_text(encoding="utf-8").splitlines():
            try:
                valid.append(json.loads(line))
            except json.JSONDecodeError:
                self.outcome.invalid_lines += 1
        expected = set(self.base.results)
        seen = Counter(row["_ng_rollout_id"] for row in valid)
        missing = sorted(set(self.base.results) - {row["_ng_rollout_id"] for row in valid})
        self.say(f"job checked: {len(valid)} rows, {len(missing)} missing {missing[:6]}; job {self.job()}")
        self.outcome.rollouts += len(valid)
        self.outcome.duplicates += sorted(r for r, n in seen.items() if n > 1)
        self.outcome.missing += sorted(expected - set(seen))
        for row in valid:
            rid = row["_ng_rollout_id"]
            if "error" in row:
                self.outcome.errors.append(f"{rid}: {str(row['error'])[:200]}")
            elif rid in self.base.results and row.get("reward") != self.base.results[rid].get("reward"):
                self.outcome.differences.append(f"{rid}: {row.get('reward')} vs {self.base.results[rid].get('reward')}")
            elif rid in self.base.results and training_tokens(row) != training_tokens(self.base.results[rid]):
                self.outcome.differences.append(f"{rid}: token ids or log-probs differ from the uninterrupted run")
        return run


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the demo stack a long run drives (chaos.py and soak.py): where it checkpoints, how fast it
    generates."""
    parser.add_argument(
        "--storage",
        default=None,
        help="file:///path (default: a temporary folder), s3://bucket/prefix, "
        "or embedded-s3 (a local SeaweedFS, as the demo's)",
    )
    parser.add_argument(
        "--s3-endpoint",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="S3 endpoint for --storage s3://... (default $AWS_ENDPOINT_URL)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=120.0,
        help="generation speed of the inference worker per stream (default 120)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=50, help="fault cycles to run (default 50)")
    parser.add_argument(
        "--kinds",
        default=None,
        help="which fault kinds to draw from (default abcde with --storage embedded-s3, else abcd)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the random kinds and moments (default 1)")
    add_stack_arguments(parser)
    parser.add_argument("--repeats", type=int, default=2, help="rollouts per task (default 2)")
    args = parser.parse_args(argv)
    owned_s3 = args.storage == "embedded-s3"
    kinds = args.kinds or (KINDS if owned_s3 else "".join(k for k in KINDS if k not in S3_KINDS))
    if not owned_s3 and any(k in S3_KINDS for k in kinds):
        parser.error(f"kinds {S3_KINDS} stop the S3 server: only with --storage embedded-s3")
    tmp = tempfile.mkdtemp(prefix="gymckpt-chaos-")  # removed after a run that ends; kept (with every log) if not
    storage_config = (
        StorageConfig(endpoint_url=args.s3_endpoint) if args.storage and args.storage.startswith("s3://") else None
    )
    story = Story(
        Path(tmp) / "story",
        storage=args.storage,
        storage_config=storage_config,
        repeats=args.repeats,
        tokens_per_second=args.tokens_per_second,
        timeout_s=600,
        say=lambda text: None,
    )
    try:
        story.prepare()
        print("uninterrupted run ...", file=sys.stderr, flush=True)
        base = story.uninterrupted()
        chaos = Chaos(
            story, base, random.Random(args.seed), kinds, say=lambda text: print(text, file=sys.stderr, flush=True)
        )
        chaos.run(args.cycles)
    except BaseException:
        story.close()
        print(f"the run failed; its work folder and logs are kept in {tmp}", file=sys.stderr, flush=True)
        raise
    story.close()  # the local S3 is found through its folder: stopped before the folder goes
    shutil.rmtree(tmp, ignore_errors=True)
    outcome = chaos.outcome
    print(outcome.table("file" if args.storage is None or args.storage.startswith("file://") else "s3"))
    for note in outcome.notes:
        print("  ", note)
    for problem in (outcome.differences + outcome.duplicates + outcome.missing + outcome.errors)[:20]:
        print("  ", problem)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
