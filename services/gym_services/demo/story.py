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

from gym_services.base.affinity import replica_for
from gym_services.base.config import StorageConfig
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionPhase, TransactionResult
from gym_services.demo.stack import demo_stack, write_tasks
from gym_services.demo.workers import LLAMA_MAX_OUTPUT_TOKENS
from gym_services.models.policy_model.ledger.client import LedgerClient, LedgerRefused
from gym_services.models.policy_model.ledger.wire import FrozenRollout
from gym_services.stack.discovery import discover
from gym_services.stack.history import TakenCheckpoint, Termination
from gym_services.stack.launcher import StackState, alive, stack_secrets, start_stack, stop_stack
from gym_services.stack.objectstore import EMBEDDED_S3, REGION, ObjectStoreError, start_local_s3, stop_local_s3
from gym_services.stack.objectstore import location as embedded_location
from gym_services.stack.schedule import CheckpointSettings

Say = Callable[[str], None]
WORKER = "inference-worker"
MODEL = "policy-model"


class StoryError(RuntimeError):
    """The story could not be told (a server failed, a wait ran out)."""


@dataclass
class Run:
    """What one run produced."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout id -> result row
    duplicates: list[str] = field(default_factory=list)
    tokens_generated: int = 0  # every token the policy models received from their inference workers in this run
    duration_s: float = 0.0
    checkpoint: TransactionResult | None = None
    restore: TransactionResult | None = None
    #: tokens the checkpointed stack's policy models had received at the checkpoint's capture (the checkpoint holds
    #: them)
    tokens_before_cut: int = 0
    #: tokens they received after the checkpoint, lost with them in the crash
    tokens_lost_in_crash: int = 0
    #: tokens the restored stack's policy models received
    tokens_after_restore: int = 0
    tokens_reused: int = 0
    in_flight: dict[str, Any] = field(default_factory=dict)
    stale_call: dict[str, Any] = field(default_factory=dict)
    #: the inference worker killed mid-generation (``--workers`` > 1): which, and what it was doing
    worker_killed: dict[str, Any] = field(default_factory=dict)
    #: the collection's episodes run again (as attempt + 1) before the checkpoint: a worker kill must cause none
    reruns_before_checkpoint: int = 0
    #: the killed worker's tokens as the policy models received them (worker name -> tokens)
    delivered: dict[str, int] = field(default_factory=dict)
    #: rollout id -> its token ledger frozen after the run (what a trainer reads); absent: the policy model held none
    ledgers: dict[str, FrozenRollout] = field(default_factory=dict)
    #: a stack that checkpoints itself (demo/preemption.py): the line its automatic resume said
    resumed_line: str = ""
    #: the newest scheduled checkpoint before a crash, and when the crash came (unix time)
    newest: TakenCheckpoint | None = None
    crashed_at: float | None = None
    #: the termination a preempted stack handled: its final checkpoint, signal to published
    termination: Termination | None = None
    #: process name -> the counters of its metrics when it exited after the final checkpoint
    exit_counters: dict[str, dict[str, float]] = field(default_factory=dict)


def model_tokens(live: dict[str, dict[str, Any]], count: str = "tokens_generated") -> int:
    """Every token the policy models received from their inference workers, from their status ``live`` counts
    (participant id -> live): the count of generated tokens for any engine, taken where the tokens arrive. A token an
    inference worker generated that never reached a policy model (its worker or the policy model died first) is
    lost and counted nowhere, like every token lost to a crash. ``count="tokens_generated_at_capture"``: those
    received by the last capture, every token a checkpoint can hold (its streams went on after it)."""
    return sum(
        int(counts.get(count, 0))
        for participant, counts in live.items()
        if participant == MODEL or participant.startswith(MODEL + "-")
    )


def delivered_by(live: dict[str, dict[str, Any]], worker_url: str) -> int:
    """Tokens every policy model received from the worker at ``worker_url``, from their status ``live``
    counts (participant id -> live; each policy model's fleet counts what each worker delivered to it)."""
    total = 0
    for participant, counts in live.items():
        if participant != MODEL and not participant.startswith(MODEL + "-"):
            continue
        for url, worker in (counts.get("worker_states") or {}).items():
            if url == worker_url or url.startswith(worker_url + "/"):
                total += int(worker.get("tokens_received", 0))
    return total


def model_status(state: StackState) -> dict[str, dict[str, Any]]:
    """The status ``live`` counts of every policy model replica (participant id -> live)."""
    token = stack_secrets(Path(state.state_dir))["control_token"]
    return {
        server.name: httpx.get(
            f"{server.url}/ng-control/v1/checkpoint/status",
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        ).json()["live"]
        for server in state.replicas_of(MODEL)
    }


def streams_on(live: dict[str, dict[str, Any]], worker_url: str) -> int:
    """The streams the policy models have open on the worker at ``worker_url`` (from their status ``live``)."""
    return sum(
        int(worker.get("streams", 0))
        for counts in live.values()
        for url, worker in (counts.get("worker_states") or {}).items()
        if url == worker_url or url.startswith(worker_url + "/")
    )


def kill_process(pid: int) -> None:
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


def job_status(state: StackState, http: httpx.Client | None = None) -> dict[str, Any]:
    """The collection's current job; through ``http`` when a caller polls (a client per call costs a TLS context,
    about 20 ms of CPU)."""
    if http is None:
        with httpx.Client(timeout=10) as once:
            return job_status(state, once)
    job: dict[str, Any] = http.get(f"{state.url('collection')}/jobs/current", headers=_auth(state)).json()
    return job


async def wait_job(
    state: StackState, timeout_s: float, progress: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10, headers=_auth(state)) as http:
        while time.monotonic() < deadline:
            job: dict[str, Any] = (await http.get(f"{state.url('collection')}/jobs/current")).json()
            if progress:
                progress(job)
            if job["state"] == "completed":
                return job
            await asyncio.sleep(0.1)
    raise StoryError(f"collection did not finish within {timeout_s}s")


async def freeze_ledgers(model_urls: list[str], rollout_ids: list[str]) -> dict[str, FrozenRollout]:
    """Freeze every rollout's token ledger, as a trainer does once the rollout is collected. A rollout no
    replica holds a ledger for (404 not_found) is left out: a trainer has nothing of it to train on."""
    client = LedgerClient(model_urls)
    frozen: dict[str, FrozenRollout] = {}
    try:
        for rollout_id in rollout_ids:
            try:
                frozen[rollout_id] = await client.freeze(rollout_id)
            except LedgerRefused as exc:
                if exc.code != "not_found":
                    raise StoryError(f"freezing the token ledger of {rollout_id} failed: {exc}") from None
    finally:
        await client.close()
    return frozen


def read_results(path: Path, run: Run) -> None:
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
        replicas: int = 1,
        workers: int = 1,
        kill_worker_at: float | None = None,
        timeout_s: float = 600.0,
        engine: str = "builtin",
        tasks_per_environment: int | None = None,
        say: Say = print,
        progress: Callable[[str, dict[str, Any]], None] | None = None,
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
        self.replicas, self.workers = replicas, workers
        if kill_worker_at is not None and (workers < 2 or not 0 < kill_worker_at < checkpoint_at):
            raise StoryError(
                "killing a worker mid-generation needs at least 2 workers, and happens before the checkpoint"
            )
        self.kill_worker_at = kill_worker_at
        self.timeout_s = timeout_s
        self.engine = engine
        #: the first this many example tasks of each environment (None: all of them)
        self.tasks_per_environment = tasks_per_environment
        #: how far a log-prob may be from the uninterrupted run's (0: bit for bit)
        self.say = say
        self.progress = progress

    # --- helpers -----------------------------------------------------------------------

    def start(self, name: str, checkpoint: CheckpointSettings | None = None) -> StackState:
        """The demo stack ``name``; with ``checkpoint``, a stack that checkpoints itself into the story's storage (its
        supervisor is started once it is resumed: demo/preemption.py)."""
        config = demo_stack(
            self.workdir / name,
            tokens_per_second=self.tokens_per_second,
            latency_s=self.latency_s,
            job_dir=self.workdir,
            replicas=self.replicas,
            workers=self.workers,
            engine=self.engine,
        )
        if checkpoint is not None:
            config.checkpoint, config.storage = checkpoint, self.storage
        return start_stack(
            config,
            self.workdir,
            ready_timeout_s=120 + 30 * max(self.replicas, self.workers),
            env=self.server_env,
            supervise=checkpoint is not None,
        )

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

    def submit(self, state: StackState, output: Path) -> dict[str, Any]:
        spec = {
            "tasks_path": str(self.tasks_path),
            "output_path": str(output),
            "repeats": self.repeats,
            "concurrency": self.concurrency,
        }
        resp = httpx.post(f"{state.url('collection')}/jobs", json=spec, headers=_auth(state), timeout=30)
        if resp.status_code != 200:
            raise StoryError(f"collection refused the job: {resp.text}")
        job: dict[str, Any] = resp.json()
        return job

    def bar(self, label: str) -> Callable[[dict[str, Any]], None] | None:
        progress = self.progress
        if progress is None:
            return None
        return lambda job: progress(label, job)

    # --- the two runs ----------------------------------------------------------------------

    def prepare(self) -> None:
        if self.embedded_s3:
            stop_local_s3(self.workdir / "s3")  # one a killed earlier demo left running
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        if self.embedded_s3:
            self._start_object_store()
        if self.engine == "llama.cpp":
            self._prepare_llama_cpp()
        self.tasks_path = self.workdir / "tasks.jsonl"
        self.agent_env = write_tasks(
            self.tasks_path,
            max_output_tokens=LLAMA_MAX_OUTPUT_TOKENS if self.engine == "llama.cpp" else None,
            per_environment=self.tasks_per_environment,
        )
        self.tasks = [json.loads(line) for line in self.tasks_path.read_text().splitlines()]

    def _prepare_llama_cpp(self) -> None:
        """The llama-server binary and the tiny model, before any stack starts: a missing engine extra is one
        line with the next step, and the model (made once per cache, a few seconds) is not made while a stack waits."""
        from gym_services.models.llama_cpp.server import LlamaServerMissing, find_llama_server
        from gym_services.models.llama_cpp.tiny_model import EngineExtraMissing, ensure_tiny_model

        try:
            find_llama_server()
            ensure_tiny_model()
        except (LlamaServerMissing, EngineExtraMissing) as exc:
            raise StoryError(str(exc)) from None

    def uninterrupted(self) -> Run:
        run = Run()
        output = self.workdir / "uninterrupted.jsonl"
        state = self.start("uninterrupted")
        try:
            started = time.perf_counter()
            self.submit(state, output)
            asyncio.run(wait_job(state, self.timeout_s, self.bar("uninterrupted")))
            run.duration_s = time.perf_counter() - started
            run.tokens_generated = model_tokens(model_status(state))
            read_results(output, run)
            run.ledgers = asyncio.run(freeze_ledgers(state.urls(MODEL), sorted(run.results)))
        finally:
            stop_stack(self.workdir / "uninterrupted")
        return run

    def checkpointed(self) -> Run:
        run = Run()
        output = self.workdir / "checkpointed.jsonl"
        state_dir = self.workdir / "checkpointed"
        state = self.start("checkpointed")
        token = stack_secrets(state_dir)["control_token"]
        checkpoint_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            started = time.perf_counter()
            self.submit(state, output)
            bar = self.bar("checkpointed")
            if self.kill_worker_at is not None:
                self.wait_for_progress(state, self.timeout_s, share=self.kill_worker_at, bar=bar)
                run.worker_killed = self.kill_worker(state)
                self.say(
                    f"  killed inference worker {run.worker_killed['name']} with SIGKILL while it streamed "
                    f"{run.worker_killed['streaming']} generations"
                )
            self.wait_for_progress(state, self.timeout_s, bar=bar)
            run.reruns_before_checkpoint = int(job_status(state).get("reruns", 0))
            run.checkpoint = asyncio.run(self._checkpoint(state, token, checkpoint_id, run))
            if run.checkpoint.status != "completed":
                raise StoryError(f"checkpoint failed: {run.checkpoint.error}")
            run.tokens_lost_in_crash = self.crash(state) - run.tokens_before_cut
        finally:
            stop_stack(state_dir, kill=True)  # the crash: every process, SIGKILL
        self.say(f"  killed every process with SIGKILL after checkpoint {checkpoint_id}")
        state = self.start("checkpointed")  # fresh processes, same participant ids and secrets
        try:
            run.restore = asyncio.run(self._restore(state, token, checkpoint_id, run))
            if run.restore.status != "completed":
                raise StoryError(f"restore failed: {run.restore.error}")
            asyncio.run(wait_job(state, self.timeout_s, self.bar("restored")))
            run.duration_s = time.perf_counter() - started
            models = model_status(state)
            run.tokens_after_restore = model_tokens(models)
            run.tokens_reused = sum(int(live.get("tokens_reused", 0)) for live in models.values())
            read_results(output, run)
            run.ledgers = asyncio.run(freeze_ledgers(state.urls(MODEL), sorted(run.results)))
        finally:
            stop_stack(state_dir)
        return run

    def wait_for_progress(
        self,
        state: StackState,
        timeout_s: float,
        share: float | None = None,
        bar: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Wait until ``share`` (default ``checkpoint_at``) of the rollouts finished, the rest still running:
        whatever the machine's load, the checkpoint (or the worker kill) then catches generations, tool calls
        and environment steps in flight (a wait for a share of the reference run's wall time could fall before
        the first token or after the last result)."""
        share = self.checkpoint_at if share is None else share
        bar = bar or self.bar("checkpointed")
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=10) as http:
            while True:
                job = job_status(state, http)
                if bar:
                    bar(job)
                if job["state"] == "completed":
                    raise StoryError("the collection finished before the checkpoint; lower --checkpoint-at")
                if job["total"] and job["finished"] >= max(1, round(share * job["total"])) and job["live"]:
                    return job
                if time.monotonic() > deadline:
                    raise StoryError(f"the collection did not reach {share:.0%} within {timeout_s:.0f}s: {job}")
                time.sleep(0.02)

    def kill_worker(self, state: StackState, want: int = 4, patience_s: float = 5.0) -> dict[str, Any]:
        """SIGKILL the last inference worker once the policy models stream ``want`` generations from it (or,
        after ``patience_s``, any); its generations continue on the other workers."""
        victim = state.replicas_of(WORKER)[-1]
        started = time.monotonic()
        while (active := streams_on(model_status(state), victim.url)) < (
            want if time.monotonic() - started < patience_s else 1
        ):
            if time.monotonic() - started > 30:
                raise StoryError(f"inference worker {victim.name} streamed nothing for 30s")
            time.sleep(0.01)
        kill_process(victim.pid)  # at once: a look at the other workers first would let the victim's streams finish
        return {"name": victim.name, "url": victim.url, "streaming": active}

    def worker_failover(self, want: int = 4) -> Run:
        """Collect every task with the last inference worker SIGKILLed once it streams ``want`` generations,
        and no checkpoint: its generations must continue on the other workers, costing no episode and no
        token (``tokens_before_cut`` holds every worker's tokens, the killed one's included)."""
        if self.workers < 2:
            raise StoryError("a worker failover needs at least 2 workers")
        run = Run()
        output = self.workdir / "failover.jsonl"
        state = self.start("failover")
        try:
            started = time.perf_counter()
            self.submit(state, output)
            run.worker_killed = self.kill_worker(state, want=want, patience_s=10.0)
            asyncio.run(wait_job(state, self.timeout_s, self.bar("failover")))
            run.duration_s = time.perf_counter() - started
            run.reruns_before_checkpoint = int(job_status(state).get("reruns", 0))
            run.in_flight = model_status(state)
            run.delivered = {run.worker_killed["name"]: delivered_by(run.in_flight, run.worker_killed["url"])}
            run.tokens_before_cut = model_tokens(run.in_flight)
            read_results(output, run)
            run.ledgers = asyncio.run(freeze_ledgers(state.urls(MODEL), sorted(run.results)))
        finally:
            stop_stack(self.workdir / "failover")
        return run

    def crash(self, state: StackState) -> int:
        """SIGKILL every server; return the tokens the policy models had received by then.

        The inference workers go first: once the policy models have no stream open on any of them (each
        ended at its policy model, which read it to its end), no token can arrive any more, and the policy models'
        count is read before they are killed too. So the tokens generated after the checkpoint and lost
        with the crash are counted exactly, up to the last one a dying worker wrote into its connection.
        """
        for worker in state.replicas_of(WORKER):
            kill_process(worker.pid)
        deadline = time.monotonic() + 30
        while True:
            live = model_status(state)
            streaming = sum(streams_on(live, worker.url) for worker in state.replicas_of(WORKER))
            if streaming == 0:
                break
            if time.monotonic() > deadline:
                raise StoryError(f"the policy models still stream {streaming} generations from dead workers after 30s")
            time.sleep(0.02)
        for server in state.servers:
            if server.group_name != WORKER:
                kill_process(server.pid)
        return model_tokens(live)

    async def _checkpoint(self, state: StackState, token: str, checkpoint_id: str, run: Run) -> TransactionResult:
        async with ControlClient(token, timeout_s=120) as client:
            participants = await discover(state, client)

            async def on_event(phase: TransactionPhase, detail: dict[str, Any]) -> None:
                # every participant captured (resume is next): the generations it took as far as they had streamed
                if phase is TransactionPhase.RESUMING:
                    statuses = await coordinator.status()
                    run.in_flight = {pid: getattr(s, "live", {}) for pid, s in statuses.items()}
                    if run.worker_killed:  # its streams ended long before (failed over): its clients' count is final
                        run.delivered = {
                            run.worker_killed["name"]: delivered_by(run.in_flight, run.worker_killed["url"])
                        }
                    run.tokens_before_cut = model_tokens(run.in_flight, "tokens_generated_at_capture")

            coordinator = Coordinator(participants, client, storage_config=self.storage_config, on_event=on_event)
            return await coordinator.checkpoint(checkpoint_id, self.storage, prepare_timeout_s=60, lease_s=60)

    async def _restore(self, state: StackState, token: str, checkpoint_id: str, run: Run) -> TransactionResult:
        async with ControlClient(token, timeout_s=120) as client:
            participants = await discover(state, client)
            coordinator = Coordinator(participants, client, storage_config=self.storage_config)
            result = await coordinator.restore(checkpoint_id, self.storage, lease_s=60)
        if result.status == "completed" and result.episodes:
            run.stale_call = await self.late_call(state, result.episodes)
        return result

    async def late_call(self, state: StackState, episodes: dict[str, int]) -> dict[str, Any]:
        """A late /run of the old attempt of a restored episode must be refused (409 stale_attempt)."""
        rollout_id, attempt = sorted(episodes.items())[0]
        task_index = int(rollout_id.split("-")[0])
        row = {k: v for k, v in self.tasks[task_index].items() if k != "agent"}
        body = {**row, "_ng_rollout_id": rollout_id, "_ng_attempt_index": attempt - 1}
        agents = state.urls(self.tasks[task_index]["agent"])
        async with httpx.AsyncClient(timeout=30) as http:  # the agent replica that holds the rollout
            resp = await http.post(f"{agents[replica_for(rollout_id, len(agents))]}/run", json=body)
        code = (
            (resp.json().get("error") or {}).get("code")
            if resp.headers.get("content-type", "").startswith("application/json")
            else None
        )
        return {"rollout_id": rollout_id, "attempt": attempt - 1, "status": resp.status_code, "code": code}
