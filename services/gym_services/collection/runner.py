"""Rollout collection: dispatch every (task, repeat) to its agent with bounded concurrency.

It is a checkpoint participant (role ``controller``): prepare stops new dispatch, capture
takes the cursor, finished result keys and one record per live episode (the scope the
other participants keep; :mod:`.records`), restore re-issues the live episodes as attempt + 1 and never
runs a finished one again.

Beside it: the job's tasks (:mod:`.tasks`) and its results file (:mod:`.results`); an episode's ``/run`` calls
and how its infrastructure failures are waited out (:mod:`.episodes`); what a running job waits for, the agents'
downstream reports and a warning when nothing finishes (:mod:`.watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Never

import httpx

from gym_services.base.affinity import expand_endpoints, replica_for
from gym_services.base.connection_pools import PooledTransport
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.collection.episodes import EpisodeCalls, RetryPolicy, run_body
from gym_services.collection.models import MAX_CONCURRENCY, EpisodeState, JobSpec, JobState, JobStatus
from gym_services.collection.records import job_records, read_job_records
from gym_services.collection.results import append, check_output_prefix, result_row, row_line, truncate
from gym_services.collection.resume import Earlier, read_earlier, write_job_file
from gym_services.collection.tasks import check_agents, load_tasks, task_agent
from gym_services.collection.watch import Watch
from gym_services.control.participant import InvalidState, Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode

log = get_logger("collection")


class Collection(Participant[tuple[JobState, list[EpisodeState]] | None, Never]):
    role = Role.CONTROLLER
    checkpoint_mode = CheckpointMode.EXPORTED
    checkpoint_verify = VerifyMode.WAIT

    def __init__(
        self,
        agents: dict[str, str | list[str]],
        *,
        default_agent: str | None = None,
        request_timeout_s: float = 3600.0,
        unavailable_deadline_s: float = 900.0,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        stall_warning_s: float = 60.0,
        downstream_poll_s: float = 2.0,
    ) -> None:
        #: agent name -> its replicas' base URLs in ordinal order (one for an agent without replicas)
        self.agents = {name: expand_endpoints(urls) for name, urls in agents.items()}
        self.default_agent = default_agent
        self.request_timeout_s = request_timeout_s
        self._transport = transport
        self.calls = EpisodeCalls(RetryPolicy(backoff_s, backoff_max_s, unavailable_deadline_s), sleep)
        self.job: JobState | None = None
        self.tasks: list[dict[str, Any]] = []
        self.running: dict[str, EpisodeState] = {}
        self._episode_tasks: dict[str, asyncio.Task[None]] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._gate = asyncio.Event()
        self._gate.set()
        self._write_lock = asyncio.Lock()
        self._restored: tuple[JobState, list[EpisodeState]] | None = None
        #: rollout prefixes of every job this process ran or restored: the agents, models and resources remember
        #: rollout ids (finished results, the newest attempt), so a later job never hands the same ids out again
        self._used_prefixes: set[str] = set()
        #: sha256 of the output's first ``job.output_offset`` bytes, carried on as results are appended
        self._output_hash = hashlib.sha256()
        self._done = asyncio.Event()
        self._client: httpx.AsyncClient | None = None
        self.watch = Watch(
            self._done,
            self._gate,
            self._live_replicas,
            self._waiting,
            stall_warning_s=stall_warning_s,
            downstream_poll_s=downstream_poll_s,
        )
        self._resumed_episodes = 0  # episodes in flight the latest restore continued
        self._preparing: str | None = None  # the checkpoint being taken: its job record names it

    # --- job control -------------------------------------------------------------------

    def status(self) -> JobStatus:
        job = self.job
        if job is None:
            return JobStatus(state="idle")
        done = job.cursor >= job.total and not self.running
        finished = len(job.finished)
        return JobStatus(
            state="completed" if done else ("running" if self._gate.is_set() else "paused"),
            retrying=len(self.calls.retrying),
            last_failure=None if done else self.failure(),
            failing={} if done else {agent: list(failures) for agent, failures in self.watch.downstream.items()},
            idle_s=None if done else round(self.watch.idle_s(), 3),
            total=job.total,
            dispatched=job.cursor,
            finished=finished,
            live=len(self.running),
            errors=job.errors,
            reruns=job.reruns,
            dropped=len(job.dropped),
            mean_reward=(job.reward_sum / (finished - job.errors)) if finished > job.errors else None,
            output_path=job.spec.output_path,
            rollout_prefix=job.spec.rollout_prefix,
            kept=len(job.done_before),
            resumed_from=job.checkpoint_id,
            resumed_episodes=self._resumed_episodes,
        )

    def failure(self, most: int = 3) -> str | None:
        """Why the job waits now: the servers the agents' episodes retry (their reports), then the latest failure
        of an episode this collection runs again; none once they answer again."""
        now = time.time()
        parts = [
            f"agent {agent}: {failure.describe(now)}"
            for agent, failures in sorted(self.watch.downstream.items())
            for failure in failures
        ]
        if self.calls.last_failure is not None:
            parts.append(self.calls.last_failure)
        if not parts:
            return None
        return "; ".join(parts[:most]) + (f"; and {len(parts) - most} more" if len(parts) > most else "")

    def start(self, spec: JobSpec) -> JobStatus:
        if self.job is not None and not self._done.is_set():
            raise ApiError(ErrorCode.CHECKPOINT_BUSY, "a collection job is already running on this server")
        spec = spec.model_copy(update={"rollout_prefix": self._rollout_prefix(spec.rollout_prefix)})
        tasks = load_tasks(spec.tasks_path, spec.limit)
        if not tasks:  # refused before the output file is touched
            raise ApiError(ErrorCode.BAD_REQUEST, f"{spec.tasks_path} holds no task (one JSON object a line)")
        check_agents(tasks, spec.agent or self.default_agent, self.agents)
        Path(spec.output_path).parent.mkdir(parents=True, exist_ok=True)
        earlier = read_earlier(spec.output_path, tasks, spec.repeats) if spec.resume else Earlier()
        if not spec.resume:
            Path(spec.output_path).write_bytes(b"")
        write_job_file(spec.output_path, spec.tasks_path, tasks, spec.repeats)
        self.tasks = tasks
        self._output_hash = earlier.digest
        self.job = JobState(
            spec=spec,
            total=len(tasks) * spec.repeats,
            output_sha256=self._output_hash.hexdigest(),
            output_offset=earlier.size,
            finished=list(earlier.done.values()),
            done_before=sorted(earlier.done),
            reward_sum=earlier.reward_sum,
            errors=earlier.errors,
        )
        self._resumed_episodes = 0
        self.running.clear()
        self._used_prefixes.add(str(spec.rollout_prefix))
        self._launch()
        return self.status()

    def _rollout_prefix(self, asked: str | None) -> str:
        """The job's rollout prefix. Unless asked for: none for the first job of this server (ids ``<task>-<repeat>``,
        the same on every fresh stack: runs compare by id, and blackjack deals follow the id), ``j<n>-`` for the
        n-th. One an earlier job of this server used (or restored) is refused: its rollout ids would reach servers
        that remember them - a kept result returned for another task, an attempt refused as stale and the
        rollout dropped without a row."""
        if asked is None:
            if not self._used_prefixes:
                return ""
            return next(p for n in itertools.count(2) if (p := f"j{n}-") not in self._used_prefixes)
        if asked in self._used_prefixes:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"rollout_prefix {asked!r} was used by an earlier job on this collection server: the servers remember "
                "its rollout ids (finished results, attempts), so they would not run again; choose another "
                "rollout_prefix, or leave it out for a fresh one",
            )
        return asked

    def _launch(self) -> None:
        self._done.clear()
        self.calls.clear()
        if self._client is None:
            # one connection per running episode (a /run holds its connection until the episode ends): httpx's
            # default pool of 100 would hold every episode past the 100th back, however high the job's concurrency;
            # in small pools (thousands of episodes' calls in one pool cost it most of the server's loop)
            self._client = httpx.AsyncClient(
                transport=self._transport or PooledTransport(MAX_CONCURRENCY),
                timeout=self.request_timeout_s,
                trust_env=False,
            )
        self.watch.start(self._client)
        for episode in list(self.running.values()):
            self._start_episode(episode)
        self._dispatcher = asyncio.create_task(self._dispatch(), name="collection-dispatch")

    async def wait(self) -> None:
        await self._done.wait()

    async def close(self) -> None:
        for task in [self._dispatcher, *self.watch.tasks(), *self._episode_tasks.values()]:
            if task is not None:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()

    # --- dispatch ----------------------------------------------------------------------

    def _episode_at(self, index: int) -> EpisodeState:
        assert self.job is not None
        repeats = self.job.spec.repeats
        task_index, rollout_index = divmod(index, repeats)
        agent = task_agent(self.tasks[task_index], self.job.spec.agent or self.default_agent)
        return EpisodeState(
            rollout_id=f"{self.job.spec.rollout_prefix or ''}{task_index}-{rollout_index}",
            index=index,
            task_index=task_index,
            rollout_index=rollout_index,
            agent=str(agent),
        )

    async def _dispatch(self) -> None:
        assert self.job is not None
        job = self.job
        done_before = set(job.done_before)
        while job.cursor < job.total:
            await self._gate.wait()
            if job.cursor in done_before:  # its result is in the output already (collect --resume)
                job.cursor += 1
                continue
            if len(self.running) >= job.spec.concurrency:
                await self._slot_freed()
                continue
            episode = self._episode_at(job.cursor)
            job.cursor += 1
            self.running[episode.rollout_id] = episode
            self._start_episode(episode)
        self._check_done()

    async def _slot_freed(self) -> None:
        self._slot = asyncio.Event()
        await self._slot.wait()

    def _free_slot(self) -> None:
        slot = getattr(self, "_slot", None)
        if slot is not None:
            slot.set()

    def _check_done(self) -> None:
        if self.job is not None and self.job.cursor >= self.job.total and not self.running:
            self._done.set()

    def _start_episode(self, episode: EpisodeState) -> None:
        self._episode_tasks[episode.rollout_id] = asyncio.create_task(
            self._run_episode(episode), name=f"episode-{episode.rollout_id}-a{episode.attempt}"
        )

    def agent_url(self, episode: EpisodeState) -> str:
        """The agent replica that runs this rollout, every attempt of it (rollout affinity)."""
        replicas = self.agents[episode.agent]
        return replicas[replica_for(episode.rollout_id, len(replicas))]

    def _live_replicas(self) -> dict[str, str]:
        """The base URL of every agent replica running a live episode -> the agent (replica) it is."""
        replicas: dict[str, str] = {}
        for episode in list(self.running.values()):
            url = self.agent_url(episode)
            urls = self.agents[episode.agent]
            replicas[url] = episode.agent if len(urls) == 1 else f"{episode.agent}-{urls.index(url)}"
        return replicas

    def _waiting(self) -> dict[str, Any]:
        """What a job that makes no progress waits on, for the log."""
        return {"live": len(self.running), "retrying": len(self.calls.retrying), "last_failure": self.failure()}

    def _run_body(self, episode: EpisodeState) -> dict[str, Any]:
        return run_body(self.tasks[episode.task_index], episode)

    def _next_attempt(self, episode: EpisodeState) -> None:
        """Run a live episode again as attempt + 1 (superseded or finished meanwhile: nothing)."""
        if self.running.get(episode.rollout_id) is episode:
            episode.attempt += 1
            if self.job is not None:
                self.job.reruns += 1

    async def _run_episode(self, episode: EpisodeState) -> None:
        assert self._client is not None
        url = f"{self.agent_url(episode)}/run"
        try:
            outcome = await self.calls.run(self._client, url, episode, self._run_body, self._next_attempt)
            if outcome.superseded:
                self._drop(episode)
            else:
                await self._finish(episode, outcome.result, outcome.error)
        finally:
            if self._episode_tasks.get(episode.rollout_id) is asyncio.current_task():
                del self._episode_tasks[episode.rollout_id]

    def _drop(self, episode: EpisodeState) -> None:
        if self.running.get(episode.rollout_id) is episode:
            del self.running[episode.rollout_id]
            if self.job is not None:
                self.job.dropped.append(episode.rollout_id)
            log.warning("episode superseded", extra={"rollout_id": episode.rollout_id, "attempt": episode.attempt})
            self._free_slot()
            self._check_done()

    async def _finish(self, episode: EpisodeState, result: dict[str, Any] | None, error: str | None) -> None:
        job = self.job
        if job is None or self.running.get(episode.rollout_id) is not episode:
            return
        row = result_row(episode, result, error)
        line = row_line(row)
        async with self._write_lock:
            await asyncio.to_thread(append, job.spec.output_path, line)
            job.output_offset += len(line)
            self._output_hash.update(line)
            job.output_sha256 = self._output_hash.hexdigest()
            job.finished.append(episode.rollout_id)
            if error is not None:
                job.errors += 1
            elif isinstance(row["reward"], (int, float)):
                job.reward_sum += float(row["reward"])
        del self.running[episode.rollout_id]
        self.watch.progressed()
        self._free_slot()
        self._check_done()

    # --- participant ---------------------------------------------------------------------

    async def prepare(self, checkpoint_id: str) -> None:
        self._gate.clear()  # stop new dispatch; live episodes park at their agents' boundaries
        self._preparing = checkpoint_id

    async def export(self, scope: Scope) -> list[Record]:
        if self.job is None:
            return []
        async with self._write_lock:
            job = self.job.model_copy(deep=True, update={"checkpoint_id": self._preparing})
        return job_records(job, self.running.values(), scope)

    async def validate(self, records: list[RestoredRecord]) -> tuple[JobState, list[EpisodeState]] | None:
        if not records:
            return None
        if self.job is not None and not self._done.is_set():
            # its dispatcher and episodes would run on beside the restored job's (the same cursor, twice)
            raise InvalidState(
                "restore refused, nothing changed: a collection job is running on this server "
                f"({len(self.job.finished)} of {self.job.total} finished); restore into fresh processes, "
                "or wait until the job completes"
            )
        job, episodes = read_job_records(records)
        tasks = await asyncio.to_thread(load_tasks, job.spec.tasks_path, job.spec.limit)
        if len(tasks) * job.spec.repeats != job.total:
            raise InvalidState(f"{job.spec.tasks_path} changed: {len(tasks)} tasks x {job.spec.repeats} != {job.total}")
        self._staged_hash = await asyncio.to_thread(check_output_prefix, job)
        self._staged_tasks = tasks
        return job, episodes

    async def install(self, validated: tuple[JobState, list[EpisodeState]] | None) -> None:
        if validated is None:
            return
        job, episodes = validated
        # results written after the checkpoint go; the bytes before it were proven to be the checkpoint's (validate)
        await asyncio.to_thread(truncate, job.spec.output_path, job.output_offset)
        self.job = job
        self._used_prefixes.add(job.spec.rollout_prefix or "")
        self.tasks = self._staged_tasks
        self._output_hash = self._staged_hash
        self.running = {e.rollout_id: e for e in episodes}
        self._resumed_episodes = len(episodes)
        self._gate.clear()  # dispatch waits for resume
        self._launched_by_restore = True

    async def uninstall(self, validated: tuple[JobState, list[EpisodeState]] | None) -> None:
        self.job, self.tasks, self.running = None, [], {}

    async def resume(self) -> None:
        if getattr(self, "_launched_by_restore", False):
            self._launched_by_restore = False
            self._gate.set()
            self._launch()  # re-issues the live episodes as attempt + 1, continues the cursor
            return
        self._gate.set()

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        episode = self.running.get(rollout_id)
        if episode is None or episode.attempt > attempt:
            return False
        task = self._episode_tasks.pop(rollout_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        del self.running[rollout_id]
        if self.job is not None:
            self.job.dropped.append(rollout_id)
        self._free_slot()
        self._check_done()
        return True

    def live(self) -> dict[str, Any]:
        status = self.status()
        return {
            "episodes": status.live,
            "finished": status.finished,
            "dispatched": status.dispatched,
            "total": status.total,
        }
