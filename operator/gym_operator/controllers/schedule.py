"""A CheckpointSchedule's life (Velero's Schedule): a Checkpoint at every run, the newest ``keep`` kept.

One task of the operator runs every CheckpointSchedule of its release (:class:`Scheduler`, fed by kopf's watch of
them, :mod:`gym_operator.handlers`; no finalizer), each second or at once when one changes (:func:`tick`):

- **When**: ``spec.schedule`` (:mod:`gym_operator.cron`: 5-field cron, a descriptor, or ``@every <duration>``; UTC),
  from the last run (``status.lastScheduleTime``, or a skipped one, ``status.lastSkipped``), else from the
  schedule's creation. Runs missed while no operator ran (a restart, a leader change) are made up by one run at
  once, never several.
- **A run** creates the Checkpoint ``<schedule>-<YYYYMMDDhhmmss>`` from ``spec.template`` (labelled
  ``gym-checkpoint.dev/schedule=<schedule>`` and ``gym-checkpoint.dev/created-by=schedule``). It is skipped (Event
  ``Skipped``, ``status.lastSkipped``) while any Checkpoint of the release is in flight (never two at once) and
  while the stack holds nothing newer than its newest checkpoint (:func:`.resume.awaiting`).
- **Keep**: once a Checkpoint of the schedule has ended, the schedule's completed Checkpoints beyond the newest
  ``spec.keep`` are deleted, and so are its failed ones beyond the newest ``keep`` or older than its newest completed
  one, never one an unfinished Restore reads (Event ``Pruned``; each Checkpoint's ``deletionPolicy`` decides what
  happens to its stored objects).
- **Status**: ``phase`` (Enabled, Paused, FailedValidation with ``validationErrors``), ``lastScheduleTime``,
  ``nextScheduleTime``, ``lastCheckpoint``, ``lastSuccessfulCheckpoint`` and ``lastSuccessfulTime``, and the
  conditions ``Ready`` and ``IntervalFits`` (False when a checkpoint took longer than the shortest interval between
  runs, so runs are skipped).
- **Refused**: a schedule that does not parse, a template that is not a Checkpoint spec, and a shortest interval not
  longer than ``template.prepareTimeoutSeconds`` (the longest a checkpoint may hold the stack paused waiting for
  boundaries) get phase FailedValidation and one Warning Event, and wait for a corrected spec; the API server already
  refuses what the CRD's rules can tell (``keep: 0``, ``@every 5s``, four cron fields).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from gym_operator import cron
from gym_operator.controllers import backups, resume
from gym_operator.controllers.context import Context, pod_selector
from gym_operator.controllers.deletion import restore_reads
from gym_operator.kube import KubeError
from gym_operator.specs import CheckpointSpec, ScheduleSpec, SpecError
from gym_operator.status import condition
from gym_operator.writer import StatusWriter
from gym_services.coordination.coordinator import TransactionPhase

log = logging.getLogger("gym.operator")

SCHEDULE_LABEL = "gym-checkpoint.dev/schedule"
CREATED_BY_LABEL = "gym-checkpoint.dev/created-by"
#: how often the daemon wakes (to notice a changed spec; the body is live, so no API call)
POLL_S = 1.0
#: how often the status of the schedule's Checkpoint in flight is read
FOLLOW_S = 2.0
#: a run this late is one missed while no operator ran: it is made up once, and the next counts from then
MISSED_S = 5.0
PLURAL = "checkpointschedules"


def stamp(t: dt.datetime | None) -> str | None:
    return None if t is None else t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Plan:
    """A valid schedule: its spec, when it runs, the Checkpoint spec it stamps out."""

    spec: ScheduleSpec
    when: cron.Schedule
    checkpoint: CheckpointSpec
    shortest: dt.timedelta

    @classmethod
    def of(cls, spec: Any, now: dt.datetime) -> Plan:
        """Raises :class:`SpecError` (or :class:`cron.CronError`) saying what is wrong."""
        parsed = ScheduleSpec.parse(spec)
        when = cron.parse(parsed.schedule)
        checkpoint = parsed.checkpoint()
        shortest = cron.shortest_interval(when, now)
        if shortest.total_seconds() <= checkpoint.prepare_timeout_seconds:
            raise SpecError(
                f"spec.schedule {parsed.schedule!r} runs as often as every {shortest.total_seconds():g}s, not longer "
                f"than template.prepareTimeoutSeconds ({checkpoint.prepare_timeout_seconds:g}s), the longest a "
                "checkpoint may hold the rollouts paused: lengthen the interval or lower prepareTimeoutSeconds"
            )
        return cls(parsed, when, checkpoint, shortest)

    def next_run(self, last: dt.datetime) -> dt.datetime:
        return self.when.next_after(last)


def _created(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name")))


def to_prune(checkpoints: list[dict[str, Any]], restores: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """The schedule's Checkpoints to delete: completed ones beyond the newest ``keep``; failed ones beyond the newest
    ``keep`` or older than the newest completed one; never one being deleted, in flight, or read by a Restore that
    has not ended."""
    ended = [
        c for c in checkpoints if not (c.get("metadata") or {}).get("deletionTimestamp") and not resume.in_flight(c)
    ]
    completed = sorted((c for c in ended if (c.get("status") or {}).get("phase") == "Completed"), key=_created)[::-1]
    failed = sorted((c for c in ended if (c.get("status") or {}).get("phase") == "Failed"), key=_created)[::-1]
    newest = _created(completed[0]) if completed else None
    victims = completed[keep:] + [f for i, f in enumerate(failed) if i >= keep or (newest and _created(f) < newest)]

    def read(c: dict[str, Any]) -> bool:
        status, spec = c.get("status") or {}, c.get("spec") or {}
        location = spec.get("storageLocation", "default")
        return any(restore_reads(r, resume.name_of(c), status.get("checkpointId"), location) for r in restores)

    return [c for c in victims if not read(c)]


def duration_s(checkpoint: dict[str, Any]) -> float | None:
    """How long a checkpoint's transaction took (its start to its completion)."""
    status = checkpoint.get("status") or {}
    start, end = parse_time(status.get("startTime")), parse_time(status.get("completionTime"))
    return None if start is None or end is None else (end - start).total_seconds()


class Schedule:
    """One CheckpointSchedule: its status writer, what it knows of its Checkpoints."""

    def __init__(self, body: kopf.Body, context: Context) -> None:
        meta = body.get("metadata") or {}
        self.body, self.context = body, context
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.created = parse_time(meta.get("creationTimestamp")) or dt.datetime.now(dt.UTC)
        status = dict(body.get("status") or {})
        self.writer = StatusWriter(
            context.kube,
            PLURAL,
            self.namespace,
            self.name,
            meta.get("generation"),
            status,
            fence=context.fence,
            version=lambda: (self.body.get("metadata") or {}).get("resourceVersion"),
        )
        self.following: str | None = status.get("lastCheckpoint")  # its Checkpoint whose end is not seen yet
        self.last_follow = 0.0
        self.invalid: str | None = None  # the validation error already reported
        self._plan: tuple[str, Plan] | None = None  # (the spec it was made from, the plan)

    def plan(self, now: dt.datetime) -> Plan:
        """The plan of the current spec (made again only when the spec changed)."""
        spec = dict(self.body.get("spec") or {})
        key = json.dumps(spec, sort_keys=True, default=str)
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, Plan.of(spec, now))
        return self._plan[1]

    @property
    def status(self) -> dict[str, Any]:
        return self.writer.status

    async def event(self, reason: str, message: str, warning: bool = False) -> None:
        """An Event on the schedule (best effort)."""
        (log.warning if warning else log.info)(f"CheckpointSchedule {self.name}: {message}")
        try:
            await self.context.kube.event(dict(self.body), reason, message, warning=warning)
        except KubeError as exc:
            log.warning(f"CheckpointSchedule {self.name}: could not post the {reason} Event ({exc})")

    def write(self, **fields: Any) -> None:
        """Status fields that changed (conditions are written whole)."""
        changed = {k: v for k, v in fields.items() if self.status.get(k) != v}
        if changed:
            self.writer.generation = (self.body.get("metadata") or {}).get("generation")
            self.writer.write(changed)

    async def refuse(self, why: str) -> None:
        generation = (self.body.get("metadata") or {}).get("generation")
        self.write(
            phase="FailedValidation",
            validationErrors=[why],
            nextScheduleTime=None,
            conditions=[condition("Ready", False, "FailedValidation", why, generation)],
        )
        if self.invalid != why:
            self.invalid = why
            await self.event("FailedValidation", why, warning=True)

    def base(self) -> dt.datetime:
        """The run the next one counts from: the last run or skip, else the creation."""
        times = [parse_time(self.status.get(k)) for k in ("lastScheduleTime", "lastSkipped")]
        return max([t for t in times if t is not None], default=self.created)

    async def _ours(self) -> list[dict[str, Any]]:
        found = await self.context.kube.list_objects("checkpoints", self.namespace, f"{SCHEDULE_LABEL}={self.name}")
        return [c for c in found if (c.get("spec") or {}).get("release") == self.context.settings.release]

    async def follow(self, plan: Plan, loop_time: float) -> None:
        """Once the Checkpoint it created last has ended: the last successful one, the interval check, pruning."""
        if self.following is None or loop_time - self.last_follow < FOLLOW_S:
            return
        self.last_follow = loop_time
        ours = await self._ours()
        last = next((c for c in ours if resume.name_of(c) == self.following), None)
        if last is not None and resume.in_flight(last):
            return
        self.following = None
        completed = [c for c in ours if (c.get("status") or {}).get("phase") == TransactionPhase.COMPLETED]
        generation = (self.body.get("metadata") or {}).get("generation")
        conditions = [c for c in self.status.get("conditions") or [] if c.get("type") != "IntervalFits"]
        if completed:
            newest = max(completed, key=lambda c: str((c.get("status") or {}).get("completionTime") or ""))
            self.write(
                lastSuccessfulCheckpoint=resume.name_of(newest),
                lastSuccessfulTime=(newest.get("status") or {}).get("completionTime"),
            )
        took = duration_s(last) if last is not None else None
        if took is not None and last is not None:
            fits = took < plan.shortest.total_seconds()
            message = (
                f"Checkpoint {resume.name_of(last)} took {took:g}s; the schedule runs every "
                f"{plan.shortest.total_seconds():g}s at the most"
            )
            conditions.append(condition("IntervalFits", fits, "Fits" if fits else "Overrunning", message, generation))
            if not fits:
                await self.event("Overrunning", message + ": runs are skipped while one is in flight", warning=True)
            conditions = [c for c in conditions if c.get("type") != "TerminationFits"]
            conditions += await self._termination_fits(plan, took, resume.name_of(last), generation)
            self.write(conditions=conditions)
        await self.prune(plan, ours)

    async def _termination_fits(
        self, plan: Plan, took: float, checkpoint: str, generation: int | None
    ) -> list[dict[str, Any]]:
        """``TerminationFits``: whether a checkpoint as long as the last one fits in the shortest grace period of the
        release's pods less the termination margin (with termination checkpoints on)."""
        settings = self.context.settings
        if not settings.termination_checkpoint:
            return []
        pods = await self.context.kube.list_pods(self.namespace, pod_selector(plan.checkpoint.selector, settings))
        graces = [
            30 if pod.spec.termination_grace_period_seconds is None else pod.spec.termination_grace_period_seconds
            for pod in pods
        ]
        if not graces:
            return []
        window = min(graces) - settings.termination_margin_s
        fits = took < window
        message = (
            f"Checkpoint {checkpoint} took {took:g}s; a termination checkpoint has {window:g}s (the pods' shortest "
            f"terminationGracePeriodSeconds, {min(graces)}s, less the margin of {settings.termination_margin_s:g}s)"
        )
        if not fits:
            await self.event(
                "TerminationWindowTooShort", message + ": raise termination.gracePeriodSeconds", warning=True
            )
        return [condition("TerminationFits", fits, "Fits" if fits else "TooShort", message, generation)]

    async def prune(self, plan: Plan, ours: list[dict[str, Any]]) -> None:
        _checkpoints, restores = await resume.release_resources(self.context, self.namespace)
        for victim in to_prune(ours, restores, plan.spec.keep):
            meta = victim.get("metadata") or {}
            try:
                await self.context.kube.delete_object("checkpoints", self.namespace, meta["name"], meta["uid"])
            except KubeError as exc:
                log.warning(f"CheckpointSchedule {self.name}: pruning {meta['name']} failed ({exc}); next time")
                continue
            phase = (victim.get("status") or {}).get("phase")
            await self.event(
                "Pruned", f"deleted {phase} Checkpoint {meta['name']}: the schedule keeps {plan.spec.keep}"
            )

    async def fire(self, plan: Plan, due: dt.datetime, now: dt.datetime) -> None:
        """One run: a Checkpoint, or a skip saying why."""
        checkpoints, _restores = await resume.release_resources(self.context, self.namespace)
        busy = sorted(resume.name_of(c) for c in checkpoints if resume.in_flight(c))
        why = f"Checkpoint {busy[0]} of the release is in flight" if busy else None
        if why is None:
            why = await resume.awaiting(self.context, self.namespace)
        if why is not None:
            self.write(lastSkipped=stamp(now))
            await self.event("Skipped", f"run of {stamp(due)} skipped: {why}")
            return
        ran_at = due if (now - due).total_seconds() <= MISSED_S else now  # a missed run: made up once, now
        name = f"{self.name}-{ran_at.strftime('%Y%m%d%H%M%S')}"
        body = {
            "kind": "Checkpoint",
            "metadata": {
                "name": name,
                "labels": {SCHEDULE_LABEL: self.name, CREATED_BY_LABEL: "schedule", backups.EXCLUDE: "true"},
            },
            "spec": {**plan.spec.template, "release": plan.spec.release},
        }
        try:
            self.context.fence()  # (the leader's term: a leader past it creates nothing)
            await self.context.kube.create_object("checkpoints", self.namespace, body)
        except KubeError as exc:
            if exc.status != 409:  # (409: an earlier operator made this very run)
                raise
        self.following, self.last_follow = name, 0.0
        self.write(lastScheduleTime=stamp(ran_at), lastCheckpoint=name)
        await self.event("Scheduled", f"created Checkpoint {name}")


class Scheduler:
    """Every CheckpointSchedule of the release, run by one task: kopf's watch feeds it (:meth:`observe`), and no
    schedule holds a finalizer (deleting one, its CRD or its namespace never waits for the operator)."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.schedules: dict[str, Schedule] = {}  # uid -> its state
        self.changed = asyncio.Event()

    def observe(self, event_type: str | None, body: kopf.Body) -> None:
        """A watch event of a CheckpointSchedule of the release."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid"))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            gone = self.schedules.pop(uid, None)
            if gone is not None:
                asyncio.get_running_loop().create_task(gone.writer.close())
            return
        if uid in self.schedules:
            self.schedules[uid].body = body
        else:
            self.schedules[uid] = Schedule(body, self.context)
            self.context.namespaces.add(str(meta.get("namespace")))
        self.changed.set()

    async def run(self) -> None:
        """Until cancelled (the operator stops): every schedule's step, every :data:`POLL_S` or on a change."""
        loop = asyncio.get_running_loop()
        while True:
            self.changed.clear()
            for schedule in list(self.schedules.values()):
                try:
                    await tick(schedule, dt.datetime.now(dt.UTC), loop.time())
                except KubeError as exc:
                    log.warning(f"CheckpointSchedule {schedule.name}: {exc}; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), POLL_S)


async def tick(schedule: Schedule, now: dt.datetime, loop_time: float) -> None:
    """One look at a schedule: refuse a spec that cannot run; follow its last Checkpoint, say what is next, run when
    due."""
    try:
        plan = schedule.plan(now)
    except (SpecError, cron.CronError) as exc:
        await schedule.refuse(str(exc))
        return
    schedule.invalid = None
    generation = (schedule.body.get("metadata") or {}).get("generation")
    await schedule.follow(plan, loop_time)
    if plan.spec.paused:
        message = "spec.paused is true: no runs until it is false"
        schedule.write(
            phase="Paused",
            validationErrors=None,
            nextScheduleTime=None,
            conditions=_ready(schedule, False, "Paused", message, generation),
        )
        return
    due = plan.next_run(schedule.base())
    message = f"runs {plan.spec.schedule} (UTC), keeps {plan.spec.keep}"
    schedule.write(
        phase="Enabled",
        validationErrors=None,
        nextScheduleTime=stamp(max(due, now)),
        conditions=_ready(schedule, True, "Enabled", message, generation),
    )
    if due <= now:
        await schedule.fire(plan, due, now)
        schedule.write(nextScheduleTime=stamp(plan.next_run(schedule.base())))


def _ready(schedule: Schedule, ok: bool, reason: str, message: str, generation: int | None) -> list[dict[str, Any]]:
    """The conditions with ``Ready`` set; the same list object when nothing changed (so nothing is written)."""
    old = schedule.status.get("conditions") or []
    current = next((c for c in old if c.get("type") == "Ready"), None)
    if (
        current is not None
        and current.get("status") == ("True" if ok else "False")
        and current.get("reason") == reason
        and current.get("message") == message
        and current.get("observedGeneration") == generation
    ):
        return list(old)
    return [c for c in old if c.get("type") != "Ready"] + [condition("Ready", ok, reason, message, generation)]
