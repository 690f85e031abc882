"""Run the stack twice — once uninterrupted, once with a checkpoint, a SIGKILL of every process
and a restore into fresh processes — and compare what came out.

Used by ``gymckpt demo`` (file storage by default) and by the process-level end-to-end test
(S3). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionPhase, TransactionResult
from gym_services.base.config import StorageConfig
from gym_services.demo.stack import demo_stack, write_tasks
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import StackState, alive, stack_secrets, start_stack, stop_stack
from gym_services.stack.objectstore import EMBEDDED_S3, REGION, ObjectStoreError, start_local_s3, stop_local_s3
from gym_services.stack.objectstore import location as embedded_location

Say = Callable[[str], None]
WORKER = "inference-worker"


class StoryError(RuntimeError):
    """The story could not be told (a server failed, a wait ran out)."""


@dataclass
class Run:
    """What one run produced."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout id -> result row
    duplicates: list[str] = field(default_factory=list)
    tokens_generated: int = 0  # by every worker process of this run
    duration_s: float = 0.0
    checkpoint: TransactionResult | None = None
    restore: TransactionResult | None = None
    #: worker tokens of the checkpointed stack when every generation was cut (the checkpoint holds them)
    tokens_before_cut: int = 0
    #: worker tokens the checkpointed stack generated after the checkpoint, lost with it in the crash
    tokens_lost_in_crash: int = 0
    #: worker tokens of the restored stack
    tokens_after_restore: int = 0
    tokens_reused: int = 0
    in_flight: dict[str, Any] = field(default_factory=dict)
    stale_call: dict[str, Any] = field(default_factory=dict)


def _worker_stats(state: StackState) -> dict[str, Any]:
    return httpx.get(f"{state.url(WORKER)}/stats", timeout=10).json()


def _worker_tokens(state: StackState) -> int:
    return int(_worker_stats(state)["tokens_generated"])


def _kill(pid: int) -> None:
    """SIGKILL a server's process group and wait until its process is gone (its sockets closed)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)  # started by this process: reaped here
    except ChildProcessError:
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


def _auth(state: StackState) -> dict[str, str]:
    """The job routes' bearer token: the stack's control token (the demo's collection has no job token of its own)."""
    return {"authorization": f"Bearer {stack_secrets(Path(state.state_dir))['control_token']}"}


def _job(state: StackState) -> dict[str, Any]:
    return httpx.get(f"{state.url('collection')}/jobs/current", headers=_auth(state), timeout=10).json()


async def _wait_job(state: StackState, timeout_s: float, progress: Callable[[dict], None] | None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10, headers=_auth(state)) as http:
        while time.monotonic() < deadline:
            job = (await http.get(f"{state.url('collection')}/jobs/current")).json()
            if progress:
                progress(job)
            if job["state"] == "completed":
                return job
            await asyncio.sleep(0.1)
    raise StoryError(f"collection did not finish within {timeout_s}s")


def _read_results(path: Path, run: Run) -> None:
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rid = row["_ng_rollout_id"]
        if rid in run.results:
            run.duplicates.append(rid)
        run.results[rid] = row


class Story:
    def __init__(
        self,
        workdir: Path,
        *,
        storage: str | None = None,
        storage_config: StorageConfig | None = None,
        repeats: int = 1,
        concurrency: int = 32,
        tokens_per_second: float = 150.0,
        latency_s: float = 0.1,
        checkpoint_at: float = 0.4,
        timeout_s: float = 600.0,
        say: Say = print,
        progress: Callable[[str, dict], None] | None = None,
    ) -> None:
        self.workdir = workdir.resolve()
        # keys are <location>/checkpoints/<id>/..., so the default location is the workdir itself
        self.embedded_s3 = storage == EMBEDDED_S3
        self.storage = embedded_location("demo") if self.embedded_s3 else (storage or f"file://{self.workdir}")
        self.storage_config = storage_config or StorageConfig()
        self.server_env: dict[str, str] = {}
        self.repeats, self.concurrency = repeats, concurrency
        self.tokens_per_second, self.latency_s = tokens_per_second, latency_s
        self.checkpoint_at = checkpoint_at
        self.timeout_s = timeout_s
        self.say = say
        self.progress = progress

    # --- helpers -----------------------------------------------------------------------

    def _start(self, name: str) -> StackState:
        config = demo_stack(
            self.workdir / name, tokens_per_second=self.tokens_per_second, latency_s=self.latency_s, job_dir=self.workdir
        )
        return start_stack(config, self.workdir, ready_timeout_s=120, env=self.server_env)

    def _start_object_store(self) -> None:
        """``--storage embedded-s3``: one local SeaweedFS for the whole demo, its keys made here."""
        import secrets

        access, secret = "gymckpt" + secrets.token_hex(8), secrets.token_urlsafe(30)
        try:
            store = start_local_s3(self.workdir / "s3", access, secret, say=self.say)
        except ObjectStoreError as exc:
            raise StoryError(str(exc)) from None
        self.server_env = store.env(access, secret)
        self.storage_config = StorageConfig(
            endpoint_url=store.endpoint, region=REGION, access_key_id=access, secret_access_key=secret
        )

    def close(self) -> None:
        """Stop what the story started besides the stacks (the local object store)."""
        if self.embedded_s3:
            stop_local_s3(self.workdir / "s3")

    def _submit(self, state: StackState, output: Path) -> dict[str, Any]:
        spec = {
            "tasks_path": str(self.tasks_path),
            "output_path": str(output),
            "repeats": self.repeats,
            "concurrency": self.concurrency,
        }
        resp = httpx.post(f"{state.url('collection')}/jobs", json=spec, headers=_auth(state), timeout=30)
        if resp.status_code != 200:
            raise StoryError(f"collection refused the job: {resp.text}")
        return resp.json()

    def _bar(self, label: str) -> Callable[[dict], None] | None:
        if self.progress is None:
            return None
        return lambda job: self.progress(label, job)  # type: ignore[misc]

    # --- the two runs ----------------------------------------------------------------------

    def prepare(self) -> None:
        if self.embedded_s3:
            stop_local_s3(self.workdir / "s3")  # one a killed earlier demo left running
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        if self.embedded_s3:
            self._start_object_store()
        self.tasks_path = self.workdir / "tasks.jsonl"
        self.agent_env = write_tasks(self.tasks_path)
        self.tasks = [json.loads(line) for line in self.tasks_path.read_text().splitlines()]

    def uninterrupted(self) -> Run:
        run = Run()
        output = self.workdir / "uninterrupted.jsonl"
        state = self._start("uninterrupted")
        try:
            started = time.perf_counter()
            self._submit(state, output)
            asyncio.run(_wait_job(state, self.timeout_s, self._bar("uninterrupted")))
            run.duration_s = time.perf_counter() - started
            run.tokens_generated = _worker_tokens(state)
        finally:
            stop_stack(self.workdir / "uninterrupted")
        _read_results(output, run)
        return run

    def checkpointed(self) -> Run:
        run = Run()
        output = self.workdir / "checkpointed.jsonl"
        state_dir = self.workdir / "checkpointed"
        state = self._start("checkpointed")
        token = stack_secrets(state_dir)["control_token"]
        checkpoint_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            started = time.perf_counter()
            self._submit(state, output)
            self.wait_for_progress(state, self.timeout_s)
            run.checkpoint = asyncio.run(self._checkpoint(state, token, checkpoint_id, run))
            if run.checkpoint.status != "completed":
                raise StoryError(f"checkpoint failed: {run.checkpoint.error}")
            run.tokens_lost_in_crash = self._crash(state) - run.tokens_before_cut
        finally:
            stop_stack(state_dir, kill=True)  # the crash: every process, SIGKILL
        self.say(f"  killed every process with SIGKILL after checkpoint {checkpoint_id}")
        state = self._start("checkpointed")  # fresh processes, same participant ids and secrets
        try:
            run.restore = asyncio.run(self._restore(state, token, checkpoint_id, run))
            if run.restore.status != "completed":
                raise StoryError(f"restore failed: {run.restore.error}")
            asyncio.run(_wait_job(state, self.timeout_s, self._bar("restored")))
            run.duration_s = time.perf_counter() - started
            run.tokens_after_restore = _worker_tokens(state)
            model = httpx.get(
                f"{state.url('policy-model')}/ng-control/v1/checkpoint/status",
                headers={"authorization": f"Bearer {token}"},
                timeout=10,
            ).json()
            run.tokens_reused = int(model["live"].get("tokens_reused", 0))
        finally:
            stop_stack(state_dir)
        _read_results(output, run)
        return run

    def wait_for_progress(self, state: StackState, timeout_s: float) -> dict[str, Any]:
        """Wait until ``checkpoint_at`` of the rollouts finished, the rest still running: whatever the machine's
        load, the checkpoint then catches generations, tool calls and environment steps in flight (a wait for a
        share of the reference run's wall time could fall before the first token or after the last result)."""
        bar = self._bar("checkpointed")
        deadline = time.monotonic() + timeout_s
        while True:
            job = _job(state)
            if bar:
                bar(job)
            if job["state"] == "completed":
                raise StoryError("the collection finished before the checkpoint; lower --checkpoint-at")
            if job["total"] and job["finished"] >= max(1, round(self.checkpoint_at * job["total"])) and job["live"]:
                return job
            if time.monotonic() > deadline:
                raise StoryError(f"the collection did not reach {self.checkpoint_at:.0%} within {timeout_s:.0f}s: {job}")
            time.sleep(0.02)

    def _crash(self, state: StackState) -> int:
        """SIGKILL every server but the inference worker; return the worker's final token count.

        The worker stands for the GPU: it is killed last (by the caller), once every stream of the
        dead policy model has ended, so the tokens generated after the checkpoint and lost with the
        crash are counted exactly, up to the last one written into a dying connection.
        """
        for server in state.servers:
            if server.name != WORKER:
                _kill(server.pid)
        deadline = time.monotonic() + 30
        while True:
            stats = _worker_stats(state)
            if stats["active"] == 0:
                return int(stats["tokens_generated"])
            if time.monotonic() > deadline:
                raise StoryError(f"the inference worker still streams {stats['active']} generations for dead clients after 30s")
            time.sleep(0.02)

    async def _checkpoint(self, state: StackState, token: str, checkpoint_id: str, run: Run) -> TransactionResult:
        async with ControlClient(token, timeout_s=120) as client:
            participants = await discover(state, client)

            async def on_event(phase: TransactionPhase, detail: dict[str, Any]) -> None:
                # every participant prepared (capture or commit is next): generations cut, nothing runs
                if phase in (TransactionPhase.CAPTURING, TransactionPhase.COMMITTING):
                    run.tokens_before_cut = _worker_tokens(state)
                    statuses = await coordinator.status()
                    run.in_flight = {pid: getattr(s, "live", {}) for pid, s in statuses.items()}

            coordinator = Coordinator(participants, client, storage_config=self.storage_config, on_event=on_event)
            return await coordinator.checkpoint(checkpoint_id, self.storage, prepare_timeout_s=60, lease_s=60)

    async def _restore(self, state: StackState, token: str, checkpoint_id: str, run: Run) -> TransactionResult:
        async with ControlClient(token, timeout_s=120) as client:
            participants = await discover(state, client)
            coordinator = Coordinator(participants, client, storage_config=self.storage_config)
            result = await coordinator.restore(checkpoint_id, self.storage, lease_s=60)
        if result.status == "completed" and result.episodes:
            run.stale_call = await self._late_call(state, result.episodes)
        return result

    async def _late_call(self, state: StackState, episodes: dict[str, int]) -> dict[str, Any]:
        """A late /run of the old attempt of a restored episode must be refused (409 stale_attempt)."""
        rollout_id, attempt = sorted(episodes.items())[0]
        task_index = int(rollout_id.split("-")[0])
        row = {k: v for k, v in self.tasks[task_index].items() if k != "agent"}
        body = {**row, "_ng_rollout_id": rollout_id, "_ng_attempt_index": attempt - 1}
        async with httpx.AsyncClient(timeout=30) as http:
            resp = await http.post(f"{state.url(self.tasks[task_index]['agent'])}/run", json=body)
        code = (resp.json().get("error") or {}).get("code") if resp.headers.get("content-type", "").startswith("application/json") else None
        return {"rollout_id": rollout_id, "attempt": attempt - 1, "status": resp.status_code, "code": code}
