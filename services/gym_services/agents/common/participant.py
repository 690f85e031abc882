"""The agent participant (role ``agent``): episodes keyed by rollout id, parked at boundaries.

- Every episode (:mod:`.episode`) records a boundary before each step (:mod:`.boundary`).
- Replay steps (seed, generation, ``replay`` verification) do not block prepare; waited
  steps (tool calls, environment steps, ``wait`` verification) do: :meth:`blockers`
  lists the episodes inside one.
- While the agent's admission is closed, an episode that reaches a boundary records it
  and parks there until resume (so prepare means: no episode inside a waited step).
- A ``409 checkpoint_parked`` from a downstream server sends the episode back to the
  boundary before that step; after a short backoff it parks (if the agent is closed
  by then) or retries.
- So does a downstream server that cannot be reached or answers ``503`` without doing
  anything (the model's worker is down): the step is retried from its boundary with a
  doubling backoff until ``unavailable_deadline_s``, then ``/run`` fails with ``503
  upstream_unavailable`` (an infrastructure failure the collection runs again). Meanwhile
  :meth:`AgentParticipant.downstream` (``GET /health/downstream``) names the server and
  route each waiting episode retries (:mod:`.waiting`), so the collection can say why nothing finishes.
- A call whose connection broke after it was sent (the server died mid-call, a reset) is
  retried the same way when its step is a replay step; a waited step may have happened
  there and is never run twice: ``/run`` fails with ``503 upstream_unavailable`` at once, and
  the collection runs the episode again as attempt + 1 (which fences what this one left).
- A capture holds a head record and its chunks per episode in scope; restore installs them under
  attempt + 1 (both: :mod:`.checkpoint`); ``/run`` with that attempt continues from the boundary.
- Retire cancels the attempt's task, waits for it and frees the episode.
- Live episodes of one task (a group of rollouts of one prompt) hold one copy of its create params
  (:mod:`.shared_params`).
- A finished episode's result is kept for a short while: a repeated ``/run`` of that
  attempt (a reply lost in transit) gets it again without running anything, and a
  checkpoint whose scope still lists the rollout (the controller has not received the
  result yet) saves its ``return`` boundary, so the restored attempt answers it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from gym_services.agents.common.boundary import RETURN, Boundary, task_row
from gym_services.agents.common.checkpoint import capture_records, read_episode, split_records
from gym_services.agents.common.config import AgentConfig
from gym_services.agents.common.context import StepContext
from gym_services.agents.common.downstream import CheckpointParked, DownstreamBrokeOff, DownstreamUnavailable
from gym_services.agents.common.episode import Episode
from gym_services.agents.common.finished import FinishedEpisode, FinishedEpisodes
from gym_services.agents.common.loop import AgentLoop, StepKind
from gym_services.agents.common.records import EPISODE_ENCODER, FrozenEpisode
from gym_services.agents.common.shared_params import SharedParams
from gym_services.agents.common.waiting import WaitingEpisodes
from gym_services.base.backoff import Backoff
from gym_services.base.downstream import DownstreamReport
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.logs import get_logger
from gym_services.base.metrics import Metrics
from gym_services.control.admission import Admission
from gym_services.control.models import Blocker
from gym_services.control.participant import Capture, InvalidState, Participant, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role

log = get_logger("agent")
RECENT_HISTORIES = 256


@dataclass(frozen=True)
class AgentMetrics:
    """What every agent counts, declared on its app's registry."""

    steps: Counter
    parks: Counter
    parked_refusals: Counter
    runs: Counter
    unavailable: Counter
    #: the model calls the ``/v1/responses`` proxy is waiting on, and their bodies' bytes: a call's body carries every
    #: earlier output item's token ids (NeMo Gym's items), held until the model answers
    model_calls: Gauge
    model_call_bytes: Gauge
    #: the finished episodes' results kept (:mod:`.finished`), and their bytes
    finished: Gauge
    finished_bytes: Gauge
    #: the training tokens the agent holds as arrays, by its live ``episodes`` or by the finished ones whose results it
    #: keeps
    token_bytes: Gauge

    @classmethod
    def declare(cls, metrics: Metrics) -> AgentMetrics:
        return cls(
            steps=metrics.counter("gym_agent_steps", "Steps run by episodes", ("step", "kind")),
            parks=metrics.counter("gym_agent_parks", "Times an episode parked at a boundary"),
            parked_refusals=metrics.counter(
                "gym_agent_parked_refusals", "409 checkpoint_parked seen from downstream", ("server",)
            ),
            runs=metrics.counter("gym_agent_runs", "Episodes started, by how", ("start",)),
            unavailable=metrics.counter(
                "gym_agent_downstream_unavailable",
                "Steps retried because a server was unreachable or down",
                ("server",),
            ),
            model_calls=metrics.gauge("gym_agent_model_calls_in_flight", "Model calls the proxy waits on"),
            model_call_bytes=metrics.gauge(
                "gym_agent_model_call_bytes_in_flight", "Bytes of the bodies of the model calls the proxy waits on"
            ),
            finished=metrics.gauge(
                "gym_agent_finished_results", "Finished results kept for a repeated /run or a checkpoint"
            ),
            finished_bytes=metrics.gauge("gym_agent_finished_result_bytes", "Bytes of the finished results kept"),
            token_bytes=metrics.gauge(
                "gym_agent_token_bytes",
                "Bytes of the token arrays held by the live episodes, and by the finished ones whose results are kept",
                ("episodes",),
            ),
        )


class AgentParticipant(Participant[dict[str, Episode], FrozenEpisode]):
    role = Role.AGENT
    checkpoint_mode = CheckpointMode.EXPORTED
    encoder = EPISODE_ENCODER  # episodes are captured frozen and their new chunks made after resume

    def __init__(
        self,
        loop: AgentLoop,
        config: AgentConfig,
        *,
        admission: Admission,
        metrics: AgentMetrics,
        context: Callable[[Episode], StepContext],
    ) -> None:
        """``admission`` is the one the app's control plane opens and closes (episodes park while it is
        closed); ``context`` gives an episode its downstream calls."""
        self.loop = loop
        self.config = config
        self.admission = admission
        self.metrics = metrics
        self._context = context
        self.episodes: dict[str, Episode] = {}
        #: recently finished episodes (at their ``return`` boundary), oldest first
        self.finished = FinishedEpisodes(
            max_age_s=config.finished_retention_s,
            max_count=config.finished_retention_max,
            max_bytes=config.finished_retention_max_bytes,
        )
        metrics.finished.set_function(lambda: len(self.finished))
        metrics.finished_bytes.set_function(lambda: self.finished.bytes)
        metrics.token_bytes.labels(episodes="live").set_function(self.live_token_bytes)
        metrics.token_bytes.labels(episodes="finished").set_function(lambda: self.finished.token_bytes)
        #: the create params of the live episodes, one object per distinct params
        self.shared_params = SharedParams()
        #: boundary names each recently ended episode went through (debugging and tests)
        self.last_history: OrderedDict[str, list[str]] = OrderedDict()
        self._reopened = asyncio.Event()
        #: episodes retrying a downstream call that could not be made, and which (:meth:`downstream`)
        self.waiting = WaitingEpisodes()

    @property
    def admission_open(self) -> bool:
        return self.admission.is_open

    # --- /run ------------------------------------------------------------------------

    async def run(self, identity: RolloutIdentity, body: dict[str, Any], *, anonymous: bool = False) -> dict[str, Any]:
        """Start, continue or join the episode of ``identity``; returns its result."""
        self._prune_finished()
        done = self.finished.get(identity.rollout_id)
        if done is not None and identity.rollout_id not in self.episodes:
            if done.attempt == identity.attempt:
                self.metrics.runs.labels(start="finished").inc()
                return done.result()  # the same attempt asked again: its result, nothing re-runs
            if done.attempt > identity.attempt:
                raise ApiError(
                    ErrorCode.STALE_ATTEMPT,
                    f"rollout {identity.rollout_id!r} attempt {identity.attempt} is stale: "
                    f"attempt {done.attempt} finished",
                )
            self.finished.pop(identity.rollout_id)
        ep = self.episodes.get(identity.rollout_id)
        if ep is not None and ep.attempt > identity.attempt:
            raise ApiError(
                ErrorCode.STALE_ATTEMPT,
                f"rollout {identity.rollout_id!r} attempt {identity.attempt} is stale: attempt {ep.attempt} is current",
            )
        if ep is not None and ep.attempt == identity.attempt:
            if ep.task is None:
                how = "continued"  # restored: go on from the boundary, no re-seed
                ep.task = self._start(ep)
            else:
                how = "joined"  # a repeated /run of a running attempt waits for the same result
        else:
            if ep is not None:
                await self._stop(ep)  # a newer attempt without a restore restarts from the row
            row = self.shared_params.share(task_row(body))
            ep = Episode(identity.rollout_id, identity.attempt, self.loop.initial(row), anonymous=anonymous)
            ep.history.append(ep.boundary.name)
            self.episodes[ep.rollout_id] = ep
            ep.task = self._start(ep)
            how = "fresh"
        del body  # its row is the episode's now; kept here, it would be a second copy until the episode ends
        self.metrics.runs.labels(start=how).inc()
        task = ep.task
        assert task is not None
        await asyncio.wait({task})  # never cancels the episode if the caller goes away
        if task.cancelled():
            raise ApiError(ErrorCode.STALE_ATTEMPT, f"rollout {ep.rollout_id!r} attempt {ep.attempt} was retired")
        exc = task.exception()
        if exc is not None:
            raise exc
        return task.result()

    def _start(self, ep: Episode) -> asyncio.Task[dict[str, Any]]:
        task = asyncio.create_task(self._drive(ep), name=f"episode-{ep.rollout_id}-{ep.attempt}")
        task.add_done_callback(lambda t: self._finished(ep, t))
        return task

    def _finished(self, ep: Episode, task: asyncio.Task[dict[str, Any]]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("episode failed", extra={"rollout_id": ep.rollout_id, "error": repr(task.exception())})
        self.waiting.clear(ep)
        self.last_history[ep.rollout_id] = list(ep.history)
        self.last_history.move_to_end(ep.rollout_id)
        while len(self.last_history) > RECENT_HISTORIES:
            self.last_history.popitem(last=False)
        if self.episodes.get(ep.rollout_id) is ep:
            del self.episodes[ep.rollout_id]
            if not task.cancelled() and task.exception() is None and not ep.anonymous:
                self._retain(ep)

    def _retain(self, ep: Episode) -> None:
        if not self.finished.keeps:
            return
        # a repeated /run and a checkpoint of a finished episode need its result only: the rest of its boundary
        # (the row, every output with its token ids, the last response, each also in the result) is not kept
        done = ep.boundary
        kept = self.loop.boundary_model.model_construct(  # its values are the validated boundary's: no second pass
            name=done.name, seq=done.seq, row={}, cookies=done.cookies, verify_mode=done.verify_mode, result=done.result
        )
        boundary = kept.model_dump(exclude_defaults=True)  # its token arrays stay the episode's (:mod:`.finished`)
        self.finished.keep(FinishedEpisode.of(ep.rollout_id, ep.attempt, boundary, time.monotonic()))

    def _prune_finished(self) -> None:
        self.finished.prune(time.monotonic())

    async def _drive(self, ep: Episode) -> dict[str, Any]:
        ctx = self._context(ep)
        refused_since: float | None = None
        unavailable = Backoff(
            self.config.unavailable_backoff_s,
            self.config.unavailable_backoff_max_s,
            self.config.unavailable_deadline_s,
        )
        while True:
            if await self._park(ep):
                refused_since = None
            boundary = ep.boundary
            hydrating = bool(ep.tokens.pending)  # restored: the tokens its checkpoint named in the ledger first
            if boundary.name == RETURN and not hydrating:
                assert boundary.result is not None
                return boundary.result
            kind = StepKind.REPLAY if hydrating else self.loop.step_kind(boundary)
            ep.enter("hydrate" if hydrating else boundary.name, kind is StepKind.WAITED)  # no await since the park
            try:
                following = await (self._hydrated(ep, ctx) if hydrating else self.loop.advance(ctx, boundary))
            except CheckpointParked as exc:
                ep.leave()  # back at the boundary before the refused step
                self.metrics.parked_refusals.labels(server=exc.server).inc()
                now = time.monotonic()
                refused_since = refused_since or now
                if now - refused_since > self.config.parked_retry_limit_s:
                    raise ApiError(
                        ErrorCode.NOT_READY, f"gave up after {now - refused_since:.0f}s of refusals: {exc}"
                    ) from None
                await asyncio.sleep(self.config.parked_backoff_s)
                continue
            except DownstreamUnavailable as exc:
                ep.leave()  # back at the boundary before the step
                self.metrics.unavailable.labels(server=exc.server).inc()
                if isinstance(exc, DownstreamBrokeOff) and kind is StepKind.WAITED:
                    # the server may have done this step: running it again here could do it twice
                    with contextlib.suppress(Exception):
                        await self.loop.on_error(ctx, boundary, exc)
                    raise ApiError(
                        ErrorCode.UPSTREAM_UNAVAILABLE,
                        f"{exc}; the {boundary.name!r} step may have happened there, so this attempt ends and "
                        "the episode runs again as a new attempt",
                    ) from None
                self.waiting.note(ep, exc)
                if not unavailable.failed():
                    raise ApiError(
                        ErrorCode.UPSTREAM_UNAVAILABLE, f"gave up after {unavailable.failing_s:.0f}s: {exc}"
                    ) from None
                backoff = unavailable.wait_s()
                log.warning(
                    "a server is unavailable; retrying the step from its boundary",
                    extra={
                        "rollout_id": ep.rollout_id,
                        "attempt": ep.attempt,
                        "step": boundary.name,
                        "error": str(exc),
                        "retry_in_s": backoff,
                    },
                )
                await asyncio.sleep(backoff)
                continue
            except Exception as exc:
                ep.leave()
                with contextlib.suppress(Exception):
                    await self.loop.on_error(ctx, boundary, exc)
                raise
            except BaseException:
                ep.leave()
                raise
            refused_since = None
            unavailable.reset()
            self.waiting.clear(ep)
            if hydrating:
                ep.boundary = following  # the same boundary, its token fields read back: not a step
                ep.leave()
                continue
            if not isinstance(following, self.loop.boundary_model) or following.seq <= boundary.seq:
                raise RuntimeError(f"{self.loop.kind} step {boundary.name} returned an invalid boundary")
            self.metrics.steps.labels(step=boundary.name, kind=kind).inc()
            ep.record(following)

    async def _hydrated(self, ep: Episode, ctx: StepContext) -> Boundary:
        """The episode's boundary with the tokens its checkpoint named in the policy model's token ledger read back
        (``docs/decisions.md``, "The agent's transcript names the ledger's tokens")."""
        pending = list(ep.tokens.pending.items())
        read = await ctx.read_ledger([call for _, call in pending])
        ep.tokens.hydrate(zip((index for index, _ in pending), read, strict=True))
        return self.loop.boundary_model.model_validate(ep.tokens.substitute(ep.boundary.model_dump()))

    def downstream(self) -> DownstreamReport:
        """The downstream calls episodes are retrying now, one entry per server and route, oldest first."""
        return self.waiting.report()

    async def _park(self, ep: Episode) -> bool:
        """Wait at the current boundary while the agent's admission is closed; True if it parked."""
        if self.admission_open:
            return False
        ep.parked = True
        self.metrics.parks.inc()
        try:
            while not self.admission_open:
                reopened = self._reopened
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reopened.wait(), self.config.park_poll_s)
        finally:
            ep.parked = False
        return True

    async def _stop(self, ep: Episode) -> None:
        """Cancel the episode's task, wait for it, and free it."""
        if ep.task is not None and not ep.task.done():
            ep.task.cancel()
            with contextlib.suppress(BaseException):
                await ep.task
        if self.episodes.get(ep.rollout_id) is ep:
            del self.episodes[ep.rollout_id]

    # --- participant ------------------------------------------------------------------

    async def prepare(self, checkpoint_id: str) -> None:
        self._reopened = asyncio.Event()  # episodes reaching a boundary from now on park

    def blockers(self) -> list[Blocker]:
        """Episodes inside a waited step; one waiting on a downstream server's answer names that server."""
        now = time.monotonic()
        blockers = []
        for ep in self.episodes.values():
            if not ep.waited:
                continue
            call = ep.in_flight
            detail = f"attempt {ep.attempt} is inside waited step {ep.step!r}"
            if call.server is not None:
                detail += f", waiting {now - call.since:.2f}s for {call.server} ({call.url})"
            blockers.append(Blocker(kind="episode", id=ep.rollout_id, detail=detail, server=call.server))
        return blockers

    async def capture(self, scope: Scope) -> Capture[FrozenEpisode]:
        """Every episode in scope as it is now (``docs/protocol.md``, "The episode record"): references only (a
        boundary is never changed once made, its chunks are bytes); a new chunk is made after resume. Chunks come
        first, then the heads: packs fill in this order, so the chunks later checkpoints reference share packs with
        few records they do not."""
        self._prune_finished()
        records = capture_records(
            self.episodes.values(), self.finished.values(), scope, self.loop.kind, self.loop.boundary_model
        )
        return Capture(records)

    async def release_out_of_scope(self, scope: Scope) -> None:
        for ep in list(self.episodes.values()):
            if ep.restored and ep.task is None and not scope.includes(ep.rollout_id):
                await self._stop(ep)

    async def validate(self, records: list[RestoredRecord]) -> dict[str, Episode]:
        """Every episode's head (schema 2: with its chunks; schema 1: the boundary whole), checked and built into
        an episode of attempt + 1; installs nothing."""
        heads, chunks = split_records(records)
        staged: dict[str, Episode] = {}
        for r in heads:
            ep = read_episode(r, chunks, self.loop.kind, self.loop.boundary_model, self.shared_params.share)
            if ep.rollout_id in staged:
                raise InvalidState(f"two records for rollout {ep.rollout_id}")
            current = self.episodes.get(ep.rollout_id)
            done = self.finished.get(ep.rollout_id)
            held = current.attempt if current is not None else done.attempt if done is not None else None
            if held is not None and (held >= ep.attempt or (current is not None and current.running)):
                raise InvalidState(
                    f"rollout {ep.rollout_id} already runs attempt {held} here; cannot install {ep.attempt}"
                )
            staged[ep.rollout_id] = ep
        if chunks:
            raise InvalidState(f"record {min(chunks)} is an episode chunk without its head")
        return staged

    async def install(self, validated: dict[str, Episode]) -> None:
        for rollout_id, ep in validated.items():
            ep.history.append(ep.boundary.name)
            self.finished.pop(rollout_id)
            self.episodes[rollout_id] = ep

    async def uninstall(self, validated: dict[str, Episode]) -> None:
        for ep in validated.values():
            await self._stop(ep)

    async def resume(self) -> None:
        self._reopened.set()

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        done = self.finished.get(rollout_id)
        dropped = done is not None and done.attempt <= attempt
        if dropped:
            self.finished.pop(rollout_id)
        ep = self.episodes.get(rollout_id)
        if ep is None or ep.attempt > attempt:
            return dropped
        await self._stop(ep)
        return True

    def live_token_bytes(self) -> int:
        """The bytes of the token arrays the live episodes' tables hold."""
        return sum(e.tokens.nbytes() for e in self.episodes.values())

    def live(self) -> dict[str, Any]:
        eps = list(self.episodes.values())
        return {
            "episodes": len(eps),
            "running": sum(1 for e in eps if e.running),
            "parked": sum(1 for e in eps if e.parked),
            "waited": sum(1 for e in eps if e.waited),
            "restored": sum(1 for e in eps if e.restored and e.task is None),
            "finished": len(self.finished),
        }

    def describe(self, rollout_id: str) -> dict[str, Any] | None:
        """Where an episode is (tests, debugging)."""
        ep = self.episodes.get(rollout_id)
        if ep is None:
            return None
        return {
            "attempt": ep.attempt,
            "boundary": ep.boundary.name,
            "seq": ep.boundary.seq,
            "step": ep.step,
            "waited": ep.waited,
            "parked": ep.parked,
            "history": list(ep.history),
        }
