"""Automatic resume (the chart's ``autoRestore``): the stack came back fresh, so the operator restores it.

**Fresh** is what the participants say: a participant's ``status.phase`` is ``fresh`` while its process has neither
checkpointed nor restored anything since it started (``docs/protocol.md``, "Phases"). Every checkpoint and restore
moves it on, so a fresh participant is one whose process is new since the stack's last transaction: a pod recreated
after a preemption or a ``helm upgrade``, a container restarted after a crash (OOM-killed, SIGKILL), or a server that
held a final checkpoint and exited. Its state from before is gone; the stack's is in the newest checkpoint.

When autoRestore is on and, with no Checkpoint or Restore of the release in flight, every participant pod is ready at
its StatefulSet's current revision (the rollout wait of :func:`.context.discover`), every participant answers, none
is mid-transaction or still holding a final checkpoint, at least one is fresh, and the checkpoint to resume from was
taken of the stack as deployed now (:func:`of_this_stack`: created after the participants' StatefulSets, which
``helm upgrade`` keeps and a reinstall makes anew, so a new install of the release is never restored from an older
one's checkpoints), the operator creates a Restore
``<release>-resume-<YYYYMMDDhhmmss>`` (label ``gym-checkpoint.dev/created-by=auto-restore``) of :func:`candidate`:
the newest completed Checkpoint of the whole release that completed at or after the last completed Restore of the
whole release, else the Checkpoint that Restore restored (the stack has moved on from there only), else, with no
Restore yet, the newest completed Checkpoint. The whole stack is restored, the participants that were not fresh too
(they hold work the fresh ones lost). Its episodes continue as attempt + 1, so nothing runs twice; a ``Resumed``
Event on the Restore names the checkpoint (:mod:`.restore`). A Restore of a checkpoint that fails is tried again,
at most :data:`MAX_ATTEMPTS` times in all; then one ``ResumeGivenUp`` Warning on the Checkpoint says what to do.

While the stack waits for that restore (:func:`awaiting`), it holds nothing newer than its newest checkpoint: the
schedule skips its runs and a terminating pod starts no termination checkpoint, so no empty checkpoint ever becomes
the newest one. A stack that holds a final checkpoint (its participants exit once it is published) waits the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Any

from gym_operator.controllers import backups
from gym_operator.controllers.context import FINAL, Context, discover, pod_selector
from gym_operator.discovery import DiscoveryError, statefulset_of
from gym_operator.kube import KubeError
from gym_operator.specs import SelectorSpec
from gym_services.control.protocol import Phase
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import TransactionPhase

log = logging.getLogger("gym.operator")

CREATED_BY_LABEL = "gym-checkpoint.dev/created-by"
AUTO_RESTORE = "auto-restore"
#: the Checkpoint an automatic Restore restores (its checkpointRef; kept for counting the attempts)
RESUMES_ANNOTATION = "gym-checkpoint.dev/resumes"
#: automatic Restores of one checkpoint that may fail before the operator stops trying it
MAX_ATTEMPTS = 3
#: how often the stack is looked at without a pod event (a participant that exited and came back in place)
TICK_S = 10.0
#: after a pod event, how long to let more come before looking (a rollout changes many pods at once)
SETTLE_S = 1.0
#: seconds a participant's status may take
STATUS_TIMEOUT_S = 5.0


def _completed(obj: dict[str, Any]) -> bool:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    return status.get("phase") == TransactionPhase.COMPLETED and not meta.get("deletionTimestamp")


def _whole(obj: dict[str, Any]) -> bool:
    """Of the whole release: no selector narrowing the stack."""
    selector = (obj.get("spec") or {}).get("selector") or {}
    return not selector.get("matchLabels") and not selector.get("matchExpressions")


def _order(obj: dict[str, Any]) -> tuple[str, bool, str, str]:
    """Completion time, then a final checkpoint after any other of the same second (the API's times are seconds, and
    nothing runs on a stack after its final checkpoint: a termination's follows the checkpoint it waited for), then
    creation time and name."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    completed = str(status.get("completionTime") or "")
    return (completed, bool(status.get("final")), str(meta.get("creationTimestamp") or ""), str(meta.get("name")))


def in_flight(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") not in FINAL


def name_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def candidate(checkpoints: list[dict[str, Any]], restores: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Checkpoint the stack resumes from (see the module's docstring), or None."""
    done = [c for c in checkpoints if _completed(c) and _whole(c)]
    restored = [r for r in restores if _completed(r) and _whole(r)]
    if not restored:
        return max(done, key=_order, default=None)
    last = max(restored, key=_order)
    since = str((last.get("status") or {}).get("completionTime") or "")
    newer = [c for c in done if str((c.get("status") or {}).get("completionTime") or "") >= since]
    if newer:
        return max(newer, key=_order)
    ref = ((last.get("spec") or {}).get("checkpointRef") or {}).get("name")
    return next((c for c in done if name_of(c) == ref), None)


def stack_since(pods: list[Any], statefulsets: list[Any]) -> str:
    """When this deployment of the stack began: the newest creation of its participant pods' StatefulSets (a pod of
    none counts itself). ``helm upgrade`` keeps the StatefulSets; a reinstall makes new ones."""
    created = {str(s.metadata.name): s.metadata.creation_timestamp for s in statefulsets}
    times = []
    for pod in pods:
        owner = statefulset_of(pod)
        when = created.get(owner) if owner else None
        times.append(when or pod.metadata.creation_timestamp)
    stamps = [t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for t in times if t is not None]
    return max(stamps, default="")


def of_this_stack(checkpoint: dict[str, Any], since: str) -> bool:
    """Whether a checkpoint was taken of the stack as deployed now (created after its StatefulSets), not of an
    earlier install of the release: a new install is fresh because it is new, and never restored by itself. The API's
    times are whole seconds, and a stack answers a checkpoint only seconds after its StatefulSets are made, so a
    checkpoint of the same second as the deployment is counted as earlier."""
    return str((checkpoint.get("metadata") or {}).get("creationTimestamp") or "") > since


def failed_attempts(restores: list[dict[str, Any]], checkpoint: str) -> int:
    """Automatic Restores of ``checkpoint`` that failed."""
    return sum(
        1
        for r in restores
        if ((r.get("metadata") or {}).get("labels") or {}).get(CREATED_BY_LABEL) == AUTO_RESTORE
        and ((r.get("metadata") or {}).get("annotations") or {}).get(RESUMES_ANNOTATION) == checkpoint
        and (r.get("status") or {}).get("phase") == TransactionPhase.FAILED
    )


async def release_resources(context: Context, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The release's Checkpoints and Restores in ``namespace``."""
    release = context.settings.release

    def ours(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [o for o in found if (o.get("spec") or {}).get("release") == release]

    kube = context.kube
    return ours(await kube.list_objects("checkpoints", namespace)), ours(await kube.list_objects("restores", namespace))


async def phases_of(context: Context, refs: list[ParticipantRef]) -> dict[str, Phase | BaseException]:
    """Every participant's phase, or why it did not say."""
    # (fenced as every control call: a leader past its term ends here instead of asking)
    async with ControlClient(context.settings.token, timeout_s=STATUS_TIMEOUT_S, fence=context.fence) as client:
        answers = await asyncio.gather(*(client.status(ref) for ref in refs), return_exceptions=True)
    return {
        ref.participant_id: answer if isinstance(answer, BaseException) else answer.phase
        for ref, answer in zip(refs, answers, strict=True)
    }


async def participant_phases(context: Context, refs: list[ParticipantRef]) -> dict[str, Phase] | None:
    """Every participant's phase; None when one does not answer."""
    phases: dict[str, Phase] = {}
    for participant, phase in (await phases_of(context, refs)).items():
        if isinstance(phase, BaseException):
            log.info(f"participant {participant} did not say its phase: {phase}")
            return None
        phases[participant] = phase
    return phases


async def nothing_new(context: Context, namespace: str, refs: list[ParticipantRef], final: bool = False) -> str | None:
    """Why the stack holds nothing newer than its newest checkpoint (None: it may, or it cannot be told): a
    participant holds a final checkpoint, or (autoRestore) it came back fresh and waits for its restore; for a
    ``final`` checkpoint also, a participant whose server has already left (it was terminating when the checkpoint
    before this one started, so that one took its last state as final, and it exited)."""
    answers = await phases_of(context, refs)
    left = sorted(p for p, phase in answers.items() if isinstance(phase, BaseException))
    if final and left:
        return f"{_named(left)} left already (the stack resumes from {await _resumes_from(context, namespace)})"
    if left:
        return None
    phases = {p: phase for p, phase in answers.items() if not isinstance(phase, BaseException)}
    holding = sorted(p for p, phase in phases.items() if phase is Phase.FINAL)
    if holding:
        one = len(holding) == 1
        waits = "holds a final checkpoint until it exits" if one else "hold a final checkpoint until they exit"
        since = await _resumes_from(context, namespace)
        return f"{_named(holding)} {waits} and come{'s' if one else ''} back fresh (the stack resumes from {since})"
    fresh = sorted(p for p, phase in phases.items() if phase is Phase.FRESH)
    if not fresh or not context.settings.auto_restore:
        return None
    chosen = await resumable(context, namespace)
    if chosen is None:
        return None
    return (
        f"{_named(fresh)} came back fresh and the stack waits for its automatic restore of Checkpoint {name_of(chosen)}"
    )


def _named(participants: list[str]) -> str:
    return ", ".join(participants)


async def _resumes_from(context: Context, namespace: str) -> str:
    """The newest complete checkpoint of the release, as a message names it."""
    newest = candidate(*await release_resources(context, namespace))
    return f"Checkpoint {name_of(newest)}" if newest is not None else "no checkpoint: it held none"


async def resumable(context: Context, namespace: str) -> dict[str, Any] | None:
    """The Checkpoint the automatic resume would restore now: the :func:`candidate`, of this stack, not given up."""
    checkpoints, restores = await release_resources(context, namespace)
    chosen = candidate(checkpoints, restores)
    if chosen is None or failed_attempts(restores, name_of(chosen)) >= MAX_ATTEMPTS:
        return None
    return chosen if of_this_stack(chosen, await deployed_since(context, namespace)) else None


async def deployed_since(context: Context, namespace: str) -> str:
    """:func:`stack_since` of the release's participant pods."""
    pods = await context.kube.list_pods(namespace, pod_selector(SelectorSpec(), context.settings))
    return stack_since(pods, await context.kube.list_statefulsets(namespace))


async def awaiting(context: Context, namespace: str, terminating_ok: bool = False) -> str | None:
    """:func:`nothing_new` of the release's whole stack (None also when the stack cannot be found)."""
    try:
        refs = await discover(namespace, SelectorSpec(), context, terminating_ok=terminating_ok)
    except (DiscoveryError, KubeError):
        return None
    return await nothing_new(context, namespace, refs)


class Resumer:
    """The automatic resume of the release in one namespace: looks at the stack after pod events (and every
    :data:`TICK_S`), and creates the Restore when it came back fresh."""

    def __init__(self, context: Context, namespace: str) -> None:
        self.context, self.namespace = context, namespace
        self.changed = asyncio.Event()
        self._said: dict[str, str] = {}  # what -> the last message logged or posted about it

    def poke(self) -> None:
        self.changed.set()

    async def run(self) -> None:
        """Until cancelled (the operator stops)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), TICK_S)
            self.changed.clear()
            await asyncio.sleep(SETTLE_S)
            try:
                await self.evaluate()
            except (KubeError, DiscoveryError) as exc:
                self._once("error", f"automatic resume: {exc}; trying again")

    def _once(self, what: str, message: str) -> bool:
        if self._said.get(what) == message:
            return False
        self._said[what] = message
        log.info(message)
        return True

    async def evaluate(self) -> None:
        """One look at the stack; a Restore when it came back fresh."""
        context, namespace = self.context, self.namespace
        checkpoints, restores = await release_resources(context, namespace)
        if any(in_flight(o) for o in checkpoints + restores):
            return  # (a Restore in flight may be ours; a Checkpoint in flight holds the stack)
        try:
            refs = await discover(namespace, SelectorSpec(), context)
        except DiscoveryError as exc:
            self._once("stack", f"automatic resume waits for the stack: {exc}")
            return
        phases = await participant_phases(context, refs)
        if phases is None:
            return
        fresh = sorted(p for p, phase in phases.items() if phase is Phase.FRESH)
        busy = sorted(p for p, phase in phases.items() if phase not in (Phase.FRESH, Phase.OPEN))
        if not fresh or busy:
            self._said.pop("none", None)
            return
        chosen = candidate(checkpoints, restores)
        if chosen is None:
            self._once("none", f"{', '.join(fresh)} came back fresh, and the release has no checkpoint to resume from")
            return
        checkpoint = name_of(chosen)
        since = await deployed_since(context, namespace)
        if not of_this_stack(chosen, since):
            self._once(
                "none",
                f"{', '.join(fresh)} are fresh, but the stack was deployed ({since}) after the newest checkpoint, "
                f"Checkpoint {checkpoint}: a new install is not restored by itself (restore it by hand if you want it)",
            )
            return
        if failed_attempts(restores, checkpoint) >= MAX_ATTEMPTS:
            message = (
                f"the automatic restore of Checkpoint {checkpoint} failed {MAX_ATTEMPTS} times (see the Restores "
                f"labelled {CREATED_BY_LABEL}={AUTO_RESTORE}); the operator stops trying it. Restore a checkpoint by "
                "hand, or delete those Restores to let it try again"
            )
            if self._once(f"given up {checkpoint}", message):
                await context.kube.event(chosen, "ResumeGivenUp", message, warning=True)
            return
        await self._restore(chosen, fresh, since)

    async def _restore(self, chosen: dict[str, Any], fresh: list[str], since: str) -> None:
        context, checkpoint = self.context, name_of(chosen)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
        name = f"{context.settings.release}-resume-{stamp}"
        body = {
            "kind": "Restore",
            "metadata": {
                "name": name,
                "labels": {CREATED_BY_LABEL: AUTO_RESTORE, backups.EXCLUDE: "true"},
                "annotations": {RESUMES_ANNOTATION: checkpoint},
            },
            "spec": {"release": context.settings.release, "checkpointRef": {"name": checkpoint}},
        }
        try:
            context.fence()  # (the leader's term: a leader past it creates nothing)
            created = await context.kube.create_object("restores", self.namespace, body)
        except KubeError as exc:
            if exc.status == 409:
                return  # created this second already
            raise
        status = chosen.get("status") or {}
        message = (
            f"{_named(fresh)} came back fresh: restoring the whole stack from Checkpoint {checkpoint} (checkpoint "
            f"{status.get('checkpointId')}, created {(chosen.get('metadata') or {}).get('creationTimestamp')}, "
            f"completed {status.get('completionTime')}; the stack was deployed {since})"
        )
        log.info(message)
        await context.kube.event(created, "Resuming", message)
