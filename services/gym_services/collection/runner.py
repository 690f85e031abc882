"""Rollout collection: dispatch every (task, repeat) to its agent with bounded concurrency.

It is a checkpoint participant (role ``controller``): prepare stops new dispatch, capture
takes the cursor, finished result keys and one record per live episode (the scope the
other participants keep), restore re-issues the live episodes as attempt + 1 and never
runs a finished one again.

Infrastructure failures are not results. An agent that cannot be reached gets the same
``/run`` again after a backoff; an agent that broke off the call (it died or the
connection dropped) or answered ``503`` (``upstream_unavailable``, ``not_ready``: a server
behind it stayed down past the agent's own deadline) gets the episode again as
attempt + 1, which fences whatever the older attempt left anywhere. Only when the
failures last ``unavailable_deadline_s`` without a result is an error row written.

An agent retries a server behind it that is down (a resources server killed, the model's worker
gone) itself, and its ``/run`` answers nothing meanwhile; so every ``downstream_poll_s`` while episodes
are live the collection reads ``GET /health/downstream`` of the agents running them
(:class:`~gym_services.base.downstream.DownstreamReport`) and shows what they wait for in
``/jobs/current`` (``failing``, and first in ``last_failure``) until they report nothing again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Never

import httpx
from pydantic import ValidationError

from gym_services.base.affinity import expand_endpoints, replica_for
from gym_services.base.backoff import Backoff
from gym_services.base.downstream import DOWNSTREAM_PATH, DownstreamFailure, DownstreamReport
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.logs import get_logger
from gym_services.collection.models import EpisodeState, JobSpec, JobState, JobStatus
from gym_services.collection.resume import Earlier, read_earlier, write_job_file
from gym_services.control.participant import InvalidState, Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode

log = get_logger("collection")


def load_tasks(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The task objects of a JSONL file. Errors name the file and line, never what it holds."""
    tasks: list[dict[str, Any]] = []
    if not os.path.isfile(path):
        why = "no such file" if not os.path.exists(path) else "not a regular file"
        raise ApiError(ErrorCode.BAD_REQUEST, f"cannot read tasks {path}: {why}")
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ApiError(
                        ErrorCode.BAD_REQUEST, f"{path}:{number} is not JSON ({exc.msg} at column {exc.colno})"
                    ) from None
                if not isinstance(row, dict):
                    raise ApiError(ErrorCode.BAD_REQUEST, f"{path}:{number} must be a JSON object")
                tasks.append(row)
                if limit is not None and len(tasks) >= limit:
                    break
    except UnicodeDecodeError:
        raise ApiError(ErrorCode.BAD_REQUEST, f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"cannot read tasks {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    return tasks


def task_agent(task: dict[str, Any], default: str | None) -> str | None:
    agent, ref = task.get("agent"), task.get("agent_ref")
    if isinstance(agent, str):
        return agent
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else default


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
        self.unavailable_deadline_s = unavailable_deadline_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._transport = transport
        self._sleep = sleep
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
        #: rollout id -> the infrastructure failure it waits out (retrying, not finished)
        self._retrying: dict[str, str] = {}
        self._last_failure: str | None = None
        self._progress_at = time.monotonic()  # the last result, or the job's (re)start
        self._watchdog: asyncio.Task[None] | None = None
        self.stall_warning_s = stall_warning_s
        self.downstream_poll_s = downstream_poll_s
        #: agent (replica) -> the downstream calls its episodes are retrying, from its latest report
        self._downstream: dict[str, list[DownstreamFailure]] = {}
        self._poller: asyncio.Task[None] | None = None
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
            retrying=len(self._retrying),
            last_failure=None if done else self.failure(),
            failing={} if done else {agent: list(failures) for agent, failures in self._downstream.items()},
            idle_s=None if done else round(time.monotonic() - self._progress_at, 3),
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
            for agent, failures in sorted(self._downstream.items())
            for failure in failures
        ]
        if self._last_failure is not None:
            parts.append(self._last_failure)
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
        default = spec.agent or self.default_agent
        unknown = [n for n, t in enumerate(tasks, 1) if task_agent(t, default) not in self.agents]
        if unknown:  # the lines, not the names: an error never echoes what the file holds
            lines = ", ".join(str(n) for n in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"{len(unknown)} {'task' if len(unknown) == 1 else 'tasks'} (task {lines}) "
                f"{'names' if len(unknown) == 1 else 'name'} no agent this collection knows "
                f"(known: {', '.join(sorted(self.agents)) or 'none'}; "
                "a task names its agent in agent or agent_ref.name)",
            )
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
        self._progress_at = time.monotonic()
        self._retrying.clear()
        self._last_failure = None
        self._downstream = {}
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_progress(), name="collection-watchdog")
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_downstream(), name="collection-downstream")
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=self.request_timeout_s, trust_env=False)
        for episode in list(self.running.values()):
            self._start_episode(episode)
        self._dispatcher = asyncio.create_task(self._dispatch(), name="collection-dispatch")

    async def wait(self) -> None:
        await self._done.wait()

    async def _watch_progress(self) -> None:
        """Say so in the log when a running job makes no progress for ``stall_warning_s`` (again every
        ``stall_warning_s``): its servers may be down, and the episodes retrying say which."""
        warned_at = self._progress_at
        while not self._done.is_set():
            await asyncio.sleep(min(5.0, self.stall_warning_s / 4))
            now = time.monotonic()
            if not self._gate.is_set() or now - max(self._progress_at, warned_at) < self.stall_warning_s:
                continue
            warned_at = now
            log.warning(
                "no episode has finished for a while",
                extra={
                    "idle_s": round(now - self._progress_at),
                    "live": len(self.running),
                    "retrying": len(self._retrying),
                    "last_failure": self.failure(),
                },
            )

    async def _poll_downstream(self) -> None:
        """Every ``downstream_poll_s`` while the job runs: what the agents running live episodes are waiting for."""
        while not self._done.is_set():
            await asyncio.sleep(self.downstream_poll_s)
            replicas: dict[str, str] = {}  # base URL -> the agent (replica) it is
            for episode in list(self.running.values()):
                url = self.agent_url(episode)
                urls = self.agents[episode.agent]
                replicas[url] = episode.agent if len(urls) == 1 else f"{episode.agent}-{urls.index(url)}"
            reports = await asyncio.gather(*(self._downstream_of(url) for url in replicas))
            self._downstream = {
                replicas[url]: failures for url, failures in zip(replicas, reports, strict=True) if failures
            }
        self._downstream = {}

    async def _downstream_of(self, url: str) -> list[DownstreamFailure]:
        """The agent's report; nothing when it cannot say (unreachable: the episodes' own calls report that)."""
        assert self._client is not None
        timeout = min(5.0, max(1.0, self.downstream_poll_s))
        try:
            resp = await self._client.get(f"{url}{DOWNSTREAM_PATH}", timeout=timeout)
            if resp.status_code != 200:
                return []
            return DownstreamReport.model_validate_json(resp.content).failing
        except (httpx.HTTPError, ValidationError):
            return []

    async def close(self) -> None:
        for task in [self._dispatcher, self._watchdog, self._poller, *self._episode_tasks.values()]:
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

    def _run_body(self, episode: EpisodeState) -> dict[str, Any]:
        task = {k: v for k, v in self.tasks[episode.task_index].items() if k not in ("agent", "agent_ref")}
        identity = RolloutIdentity(rollout_id=episode.rollout_id, attempt=episode.attempt)
        body = identity.stamp(task)
        body["_ng_task_index"] = episode.task_index
        body["_ng_rollout_index"] = episode.rollout_index
        return body

    async def _run_episode(self, episode: EpisodeState) -> None:
        assert self._client is not None
        url = f"{self.agent_url(episode)}/run"
        result: dict[str, Any] | None = None
        error: str | None = None
        retry = Backoff(
            self.backoff_s, self.backoff_max_s, self.unavailable_deadline_s, asyncio.get_running_loop().time
        )
        try:
            while True:
                next_attempt = False
                try:
                    resp = await self._client.post(url, json=self._run_body(episode))
                except UNREACHABLE as exc:  # the agent never got the call: the same one again
                    error = f"agent {episode.agent} unreachable: {type(exc).__name__}: {exc}"
                except httpx.TransportError as exc:  # broken off: the agent may have died mid-episode
                    error, next_attempt = f"agent {episode.agent} broke off /run: {type(exc).__name__}: {exc}", True
                else:
                    data = _json(resp)
                    if resp.status_code == 200:
                        result, error = data, None
                        self._last_failure = None  # the agents answer again
                        break
                    if resp.status_code == 409 and _code(data) == ErrorCode.STALE_ATTEMPT:
                        self._drop(episode)  # superseded by a newer attempt elsewhere: not ours to report
                        return
                    error = f"HTTP {resp.status_code}: {_code(data) or resp.text[:200]}"
                    if _message(data):  # what went wrong, in the row: the run's logs may be gone when it is read
                        error += f": {_message(data)}"
                    if not (resp.status_code == 503 and _code(data) in INFRASTRUCTURE_CODES):
                        break  # the episode's own outcome: a result row, even if an error
                    next_attempt = True
                if not retry.failed():
                    error = f"gave up after {retry.failing_s:.0f}s of infrastructure failures; last: {error}"
                    break
                backoff = retry.wait_s()
                log.warning(
                    "episode hit an infrastructure failure; running it again",
                    extra={
                        "rollout_id": episode.rollout_id,
                        "attempt": episode.attempt,
                        "error": error,
                        "next_attempt": next_attempt,
                        "retry_in_s": backoff,
                    },
                )
                self._retrying[episode.rollout_id] = self._last_failure = f"{episode.rollout_id}: {error}"
                try:
                    await self._sleep(backoff)
                finally:
                    self._retrying.pop(episode.rollout_id, None)
                if next_attempt and self.running.get(episode.rollout_id) is episode:
                    episode.attempt += 1  # fences whatever the older attempt left on every server
                    if self.job is not None:
                        self.job.reruns += 1
            await self._finish(episode, result, error)
        except asyncio.CancelledError:
            raise
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
        row = {
            "_ng_rollout_id": episode.rollout_id,
            "_ng_task_index": episode.task_index,
            "_ng_rollout_index": episode.rollout_index,
            "_ng_attempt_index": episode.attempt,
            "agent": episode.agent,
            "reward": (result or {}).get("reward"),
        }
        if error is not None:
            row["error"] = error
        else:
            row["result"] = result
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode()
        async with self._write_lock:
            await asyncio.to_thread(_append, job.spec.output_path, line)
            job.output_offset += len(line)
            self._output_hash.update(line)
            job.output_sha256 = self._output_hash.hexdigest()
            job.finished.append(episode.rollout_id)
            if error is not None:
                job.errors += 1
            elif isinstance(row["reward"], (int, float)):
                job.reward_sum += float(row["reward"])
        del self.running[episode.rollout_id]
        self._progress_at = time.monotonic()
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
        records = [Record("job", job.model_dump_json().encode())]
        for episode in self.running.values():
            if scope.includes(episode.rollout_id):
                records.append(
                    Record(
                        f"episode-{episode.rollout_id}",
                        episode.model_dump_json().encode(),
                        episode.rollout_id,
                        episode.attempt,
                    )
                )
        return records

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
        by_key = {r.key: r for r in records}
        if "job" not in by_key:
            raise InvalidState("controller records have no job record")
        try:
            job = JobState.model_validate_json(by_key["job"].data)
            episodes = [
                EpisodeState.model_validate_json(r.data).model_copy(update={"attempt": r.new_attempt or 0})
                for key, r in by_key.items()
                if key != "job"
            ]
        except ValidationError as exc:
            raise InvalidState(f"controller record is malformed: {exc.errors(include_url=False)[:3]}") from None
        finished = set(job.finished)
        for episode in episodes:
            if episode.rollout_id in finished:
                raise InvalidState(f"episode {episode.rollout_id} is both live and finished")
            if episode.index >= job.cursor:
                raise InvalidState(f"episode {episode.rollout_id} is past the cursor")
        tasks = await asyncio.to_thread(load_tasks, job.spec.tasks_path, job.spec.limit)
        if len(tasks) * job.spec.repeats != job.total:
            raise InvalidState(f"{job.spec.tasks_path} changed: {len(tasks)} tasks x {job.spec.repeats} != {job.total}")
        self._staged_hash = await asyncio.to_thread(_check_output_prefix, job)
        self._staged_tasks = tasks
        return job, episodes

    async def install(self, validated: tuple[JobState, list[EpisodeState]] | None) -> None:
        if validated is None:
            return
        job, episodes = validated
        # results written after the checkpoint go; the bytes before it were proven to be the checkpoint's (validate)
        await asyncio.to_thread(_truncate, job.spec.output_path, job.output_offset)
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


#: the agent never received the call
UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: ``503`` codes that mean "a server was down", not "this episode failed"
INFRASTRUCTURE_CODES = frozenset({ErrorCode.UPSTREAM_UNAVAILABLE, ErrorCode.NOT_READY})


def _message(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message", ""))[:1000]
    return ""


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _code(data: Any) -> str | None:
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _append(path: str, line: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _check_output_prefix(job: JobState, chunk: int = 1 << 20) -> Any:
    """Prove the output file's first ``output_offset`` bytes are the ones the checkpoint saw, before
    anything truncates it; :class:`InvalidState` otherwise (another job's results at the same path, a
    file edited or replaced). Returns the hash of those bytes, to carry on from."""
    path, offset = job.spec.output_path, job.output_offset
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            left = offset
            while left > 0:
                data = fh.read(min(chunk, left))
                if not data:
                    break
                digest.update(data)
                left -= len(data)
            last = b""
            if offset > 0 and left == 0:
                fh.seek(offset - 1)
                last = fh.read(1)
    except FileNotFoundError:
        left, last = offset, b""
    except OSError as exc:
        raise InvalidState(f"cannot read the results file {path}: {exc}") from None
    refuse = f"restore refused, nothing changed: the results file {path} "
    if left > 0:
        raise InvalidState(refuse + f"holds {offset - left} bytes, fewer than the {offset} the checkpoint saw")
    if job.output_sha256 is not None:
        if digest.hexdigest() != job.output_sha256:
            raise InvalidState(
                refuse + f"does not start with the {offset} bytes the checkpoint saw (their sha256 differs): it holds "
                "other content, e.g. another job's results; move it away or restore into another output path"
            )
    elif offset > 0 and last != b"\n":  # a checkpoint from before the digest: at least a line must end there
        raise InvalidState(refuse + f"has no line end at byte {offset}, where the checkpoint's results ended")
    return digest


def _truncate(path: str, size: int) -> None:
    if size == 0 and not os.path.exists(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:  # creates a missing file (a checkpoint with no result yet)
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())
