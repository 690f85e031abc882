"""A pod of the release terminates: one final Checkpoint of the whole stack, inside the pod's grace period.

The operator watches the participant pods of its release (kopf's ``on.event`` on pods, filtered to the release's
labels; :mod:`gym_operator.handlers`). A pod terminates when it gets ``metadata.deletionTimestamp`` (any deletion:
an eviction, a node drain, a spot node reclaimed, a scheduler's preemption, Kueue or KAI suspending the workload,
``helm upgrade`` replacing it) or the ``DisruptionTarget`` condition (set before the deletion by the eviction API,
the scheduler and the taint manager). Its kubelet sends SIGTERM at once and SIGKILL when the grace period ends; the
servers hold their state through it (``docs/protocol.md``, "Termination").

Then the operator creates one Checkpoint with ``spec.final`` and ``spec.deadline`` (the pod's deletion time less the
chart's ``termination.marginSeconds``), named ``<release>-termination-<YYYYMMDDhhmmss>`` and labelled
``gym-checkpoint.dev/created-by=termination``: the whole stack, one transaction, however many pods go. A pod is
covered, and starts nothing more, while a termination Checkpoint of the release is in flight or when one was created
after the pod's termination began (a wave of pods going together, an operator restarted mid-wave). A pod that
terminates while the stack holds nothing newer than its newest checkpoint (it came back fresh and waits for its
automatic restore, :mod:`.resume`: a rolling update's later pods, a second preemption) starts nothing either; an
Event on the pod says so. One that terminates while a Restore runs does start one: it follows the Restore and takes
what that restored. :mod:`.checkpoint` runs the Checkpoint like any other, taking terminating pods and going
before the stack's other waiting checkpoints.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from gym_operator.controllers import backups, resume
from gym_operator.controllers.context import FINAL, Context
from gym_operator.kube import KubeError
from gym_operator.status import now

log = logging.getLogger("gym.operator")

CREATED_BY_LABEL = "gym-checkpoint.dev/created-by"
TERMINATION = "termination"
#: the pods a termination Checkpoint was started for (names and reasons; for people)
PODS_ANNOTATION = "gym-checkpoint.dev/terminating-pods"
#: Kubernetes' default terminationGracePeriodSeconds
DEFAULT_GRACE_S = 30
#: a termination Checkpoint waits at most this long for its participants' boundaries (less when its deadline is
#: nearer)
PREPARE_TIMEOUT_S = 30


@dataclass(frozen=True)
class Termination:
    """Why and until when a pod runs: ``started`` when its termination began, ``ends`` when its grace period ends
    (SIGKILL)."""

    pod: str
    uid: str
    reason: str
    started: dt.datetime
    ends: dt.datetime


def _time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def termination_of(pod: dict[str, Any], at: dt.datetime | None = None) -> Termination | None:
    """The termination of a pod (None: it is not terminating). A deletion says when the grace period ends
    (``deletionTimestamp``, the deletion time plus ``deletionGracePeriodSeconds``); a ``DisruptionTarget``
    condition alone (the pod is about to be deleted) gives the pod's own ``terminationGracePeriodSeconds`` from the
    condition's time."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None  # its containers are done: nothing runs to hold or checkpoint
    disruption = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ),
        None,
    )
    ends = _time(meta.get("deletionTimestamp"))
    reason = str((disruption or {}).get("reason") or "")
    if ends is not None:
        grace = meta.get("deletionGracePeriodSeconds")
        started = ends - dt.timedelta(seconds=int(grace if grace is not None else DEFAULT_GRACE_S))
        reason = reason or "Deleted"
    elif disruption is not None:
        started = _time(disruption.get("lastTransitionTime")) or at or dt.datetime.now(dt.UTC)
        grace = spec.get("terminationGracePeriodSeconds")
        ends = started + dt.timedelta(seconds=int(grace if grace is not None else DEFAULT_GRACE_S))
    else:
        return None
    return Termination(str(meta.get("name")), str(meta.get("uid")), reason, started, ends)


def covered_by(termination: Termination, checkpoints: list[dict[str, Any]]) -> str | None:
    """The termination Checkpoint (of the release) that covers this termination, if one does: one in flight, or one
    created at or after the termination began (seconds, as the API stamps both)."""
    started = termination.started.replace(microsecond=0)
    for checkpoint in sorted(checkpoints, key=lambda c: str((c.get("metadata") or {}).get("creationTimestamp"))):
        meta = checkpoint.get("metadata") or {}
        created = _time(meta.get("creationTimestamp"))
        in_flight = (checkpoint.get("status") or {}).get("phase") not in FINAL and not meta.get("deletionTimestamp")
        if in_flight or (created is not None and created >= started):
            return str(meta.get("name"))
    return None


class Terminations:
    """The operator's view of its release's terminating pods: which are covered, by which Checkpoint."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.covered: dict[str, str] = {}  # pod uid -> the Checkpoint (or the reason) that covers it
        self._lock = asyncio.Lock()

    async def notice(self, pod: dict[str, Any]) -> None:
        """A pod event: a terminating pod not covered yet starts the release's termination Checkpoint."""
        settings = self.context.settings
        termination = termination_of(pod)
        if not settings.termination_checkpoint or termination is None or termination.uid in self.covered:
            return
        namespace = str((pod.get("metadata") or {}).get("namespace"))
        self.context.namespaces.add(namespace)
        async with self._lock:  # one pod at a time: the first of a wave creates it, the others find it
            if termination.uid in self.covered:
                return
            try:
                self.covered[termination.uid] = await self._cover(termination, pod, namespace)
            except KubeError as exc:
                log.error(f"pod {termination.pod} is terminating, but its termination checkpoint failed: {exc}")

    async def _cover(self, termination: Termination, pod: dict[str, Any], namespace: str) -> str:
        kube, settings = self.context.kube, self.context.settings
        selector = f"{CREATED_BY_LABEL}={TERMINATION}"
        ours = [
            c
            for c in await kube.list_objects("checkpoints", namespace, selector)
            if (c.get("spec") or {}).get("release") == settings.release
        ]
        found = covered_by(termination, ours)
        if found is not None:
            log.info(f"pod {termination.pod} is terminating ({termination.reason}): Checkpoint {found} covers it")
            return found
        deadline = termination.ends - dt.timedelta(seconds=settings.termination_margin_s)
        left = (deadline - dt.datetime.now(dt.UTC)).total_seconds()
        if left <= 1:
            message = (
                f"pod {termination.pod} is terminating ({termination.reason}) with {left:.0f}s left before its "
                f"grace period's last {settings.termination_margin_s:g}s: too late for a checkpoint. Raise the "
                "chart's termination.gracePeriodSeconds"
            )
            await self._event(pod, "TerminationTooLate", message, warning=True)
            return "too late"
        _checkpoints, restores = await resume.release_resources(self.context, namespace)
        # a Restore under way: the termination checkpoint follows it and takes what it restored (its own setup
        # refuses, NothingNewToSave, if the restore failed and the stack is fresh); one still waiting (Pending) for
        # the stack to settle has restored nothing yet
        restoring = any(
            resume.in_flight(r) and (r.get("status") or {}).get("phase") not in (None, "Pending") for r in restores
        )
        waiting = None if restoring else await resume.awaiting(self.context, namespace, terminating_ok=True)
        if waiting is not None:
            message = (
                f"pod {termination.pod} is terminating ({termination.reason}); no termination checkpoint: {waiting}"
            )
            await self._event(pod, "NothingToCheckpoint", message)
            return "nothing to checkpoint"
        name = await self._create(termination, namespace, deadline, left)
        message = (
            f"pod {termination.pod} is terminating ({termination.reason}, {left:.0f}s to the deadline): Checkpoint "
            f"{name} takes the final checkpoint of the whole stack"
        )
        await self._event(pod, "TerminationCheckpoint", message)
        return name

    async def _create(self, termination: Termination, namespace: str, deadline: dt.datetime, left: float) -> str:
        settings = self.context.settings
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
        name = f"{settings.release}-termination-{stamp}"
        body = {
            "kind": "Checkpoint",
            "metadata": {
                "name": name,
                "labels": {CREATED_BY_LABEL: TERMINATION, backups.EXCLUDE: "true"},
                "annotations": {PODS_ANNOTATION: f"{termination.pod} ({termination.reason}) at {now()}"},
            },
            "spec": {
                "release": settings.release,
                "final": True,
                "deadline": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "prepareTimeoutSeconds": max(1, min(PREPARE_TIMEOUT_S, int(left) - 2)),
                "leaseSeconds": int(settings.termination_lease_s),
                "method": "sync",
            },
        }
        try:
            self.context.fence()  # (the leader's term: a leader past it creates nothing)
            await self.context.kube.create_object("checkpoints", namespace, body)
        except KubeError as exc:
            if exc.status != 409:  # (409: created this second by an earlier operator: that one covers it)
                raise
        log.info(f"pod {termination.pod} is terminating ({termination.reason}): created Checkpoint {name}")
        return name

    async def _event(self, pod: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        (log.warning if warning else log.info)(message)
        try:
            await self.context.kube.event(pod, reason, message, warning=warning)
        except KubeError as exc:
            log.warning(f"could not post the {reason} Event: {exc}")
