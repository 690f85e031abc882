"""Every kopf handler of the operator, in one place: what kopf calls, on which resource, and the controller of
:mod:`gym_operator.controllers` (one module per lifecycle) that does the work.

- :func:`login` (``on.login``): the pod's service account, else the kubeconfig.
- :func:`startup` (``on.startup``): the settings, the Kubernetes client, the expiry task; then the storage
  locations' validation (:mod:`.controllers.location`), each location's catalog sync once it is Available
  (:mod:`.controllers.catalog`), and the metrics' newest successful checkpoint.
- :func:`checkpoint_daemon` (a ``daemon`` per Checkpoint whose transaction has not ended): its transaction
  (:mod:`.controllers.checkpoint`).
- :func:`checkpoint_seen` (``on.event`` of a Checkpoint): once the transaction ended, ``spec.ttl``
  (:mod:`.controllers.expiry`, one task for all).
- :func:`checkpoint_deleted` (``on.delete`` of a Checkpoint that needs it): its transaction cancelled, then its
  ``deletionPolicy`` (:mod:`.controllers.deletion`).
- :func:`restore_daemon` (a ``daemon`` per Restore whose transaction has not ended): its transaction
  (:mod:`.controllers.restore`).
- :func:`restore_seen` (``on.event`` of a Restore), and :func:`checkpoint_seen`: the finalizer older operators
  shared taken off the release's resources (:mod:`.controllers.release`); the label that keeps them out of Velero's
  backups (:mod:`.controllers.backups`).
- :func:`schedule_seen` (``on.event`` of a CheckpointSchedule): one task runs every schedule of the release, its
  runs, keep and status (:mod:`.controllers.schedule`); no finalizer.
- :func:`pod_event` (``on.event`` of the release's participant pods): a terminating pod starts the termination
  checkpoint (:mod:`.controllers.termination`), and any change lets the automatic resume look at the stack
  (:mod:`.controllers.resume`, a task per namespace, started with the first pod seen there).
- :func:`release_when_going_away` (``on.cleanup``): the expiry, schedule, resume and location validation tasks stop;
  the release uninstalled or its namespace deleted, the finalizers go (:mod:`.controllers.release`).

Finalizers: each release's operator has its own (:func:`~gym_operator.controllers.context.finalizer_of`), and kopf
puts it only on a resource one of these handlers matches at its deletion: a transaction that has not ended (a
daemon), a Checkpoint whose ``deletionPolicy: Delete`` has stored objects to remove (``on.delete``). A resource at
rest holds none, so deleting it, its CRD or its namespace never waits for an operator; and the operators of two
releases in one namespace never touch each other's finalizers (kopf takes its finalizer off whatever none of its
handlers match, which with one shared finalizer made them fight for ever). The ``on.event`` handlers (schedules,
pods) never hold one.

Run by ``gym-operator --namespace NS`` (:mod:`gym_operator.main`): leader election first, so only one replica of a
release's operator runs these handlers (:mod:`gym_operator.leadership`). Environment (:class:`OperatorSettings`):
``GYMCKPT_CONTROL_TOKEN`` (the Secret shared with the servers), ``GYMCKPT_GATEWAY_KEY`` (signs the servers' storage
grants), ``GYMCKPT_STORAGE`` (the storage location ``default`` when the release has no CheckpointStorageLocation
for it: an operator run without the chart), ``GYMCKPT_NAMESPACE`` (the namespace, when kopf runs the handlers without
``gym-operator``), ``GYMCKPT_RELEASE`` (the release it serves: only resources whose ``spec.release`` names it, only
pods labelled ``app.kubernetes.io/instance=<release>``), ``AWS_*`` for S3.

- Several releases may share a namespace: each operator runs only its release's resources (the kopf filter
  :func:`ours`) on its release's pods, and leaves the others' alone (no finalizer, no Event).
- Watches end every ``GYMCKPT_WATCH_TIMEOUT_SECONDS`` (server side), and the client gives up on a stream that sent
  nothing for a little longer or on any watch or call past its own deadline: a half-open connection cannot stall
  the operator while its liveness probe stays green.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import kopf

from gym_operator.controllers import (
    backups,
    catalog,
    checkpoint,
    deletion,
    location,
    release,
    restore,
    resume,
    schedule,
    termination,
)
from gym_operator.controllers.context import FINAL, Context, finalizer_of, pod_selector
from gym_operator.controllers.expiry import Expiry
from gym_operator.discovery import selector_matches
from gym_operator.kube import GROUP, VERSION, Kube, KubeError
from gym_operator.leadership import Leadership
from gym_operator.metrics import METRICS
from gym_operator.specs import OperatorSettings, SelectorSpec, SpecError

#: how often kopf checks whether a deleted resource's daemon has ended (then releases the finalizer)
DAEMON_EXIT_POLL_S = 0.5


def ours(spec: Any, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: a Checkpoint or Restore of this operator's release (``spec.release``, required by the CRDs)."""
    context = memo.get("context")
    return isinstance(context, Context) and (spec or {}).get("release") == context.settings.release


def unfinished(spec: Any, status: Any, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: ours, and its transaction has not ended (its daemon runs, and holds the finalizer)."""
    return ours(spec, memo) and (status or {}).get("phase") not in FINAL


def needed_at_deletion(spec: Any, status: Any, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: ours, and deleting it needs the operator (:func:`.controllers.deletion.needs_operator`)."""
    return ours(spec, memo) and deletion.needs_operator(spec, status)


def our_pod(body: kopf.Body, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: a participant pod of this operator's release (the label selector its stack is found by)."""
    context = memo.get("context")
    if not isinstance(context, Context):
        return False
    labels = dict((body.get("metadata") or {}).get("labels") or {})
    return selector_matches(pod_selector(SelectorSpec(), context.settings), labels)


def context_of(memo: kopf.Memo) -> Context:
    context = memo.get("context")
    assert isinstance(context, Context), "kopf runs no handler before the startup handlers"
    return context


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    try:
        operator = OperatorSettings.from_env()
    except SpecError as exc:
        raise kopf.PermanentError(str(exc)) from None
    configure(settings, operator)
    kube = Kube.connect()  # (the CRDs were checked before this replica competed for the leadership: main.py)
    leadership = memo.get("leadership")
    context = Context(
        operator,
        kube,
        identity=str(memo.get("identity") or "restarted"),
        leadership=leadership if isinstance(leadership, Leadership) else None,
    )
    memo.context = context
    memo.expiry = Expiry(context)
    memo.expiry_task = asyncio.create_task(memo.expiry.run(), name="checkpoint expiry")
    memo.terminations = termination.Terminations(context)
    memo.resumers = {}  # namespace -> (its Resumer, the task running it)
    memo.scheduler = schedule.Scheduler(context)
    memo.scheduler_task = asyncio.create_task(memo.scheduler.run(), name="checkpoint schedules")
    namespace = str(memo.get("namespace") or os.environ.get("GYMCKPT_NAMESPACE") or "")
    if namespace:
        context.namespaces.add(namespace)
        with contextlib.suppress(KubeError):  # the alert's clock starts at the newest Completed Checkpoint
            METRICS.seed(operator.release, await kube.list_objects("checkpoints", namespace))
        validator = location.Validator(context, namespace, catalog.sync)
        memo.locations = asyncio.create_task(validator.run(), name="storage locations")


def configure(settings: kopf.OperatorSettings, operator: OperatorSettings) -> None:
    """kopf's settings for this operator: Events, workers, watch and call timeouts, the finalizer."""
    settings.posting.level = logging.INFO  # INFO and up become Kubernetes Events
    settings.execution.max_workers = 4
    # A watch the API server ends every watch_timeout_s; one that went silent (no event, no bookmark) for 10 s
    # longer, or lasted 30 s longer, is dropped by the client and re-opened from the last resourceVersion; a
    # list or call without an answer in 30 s is retried. A half-open connection then costs at most that long.
    watch = operator.watch_timeout_s
    settings.watching.server_timeout = watch
    settings.watching.inactivity_timeout = watch + 10
    settings.watching.client_timeout = watch + 30
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    settings.persistence.finalizer = finalizer_of(operator.release)
    # A deleted resource's daemon ends within a second or so (it aborts, writes the outcome); kopf re-checks it
    # this often before releasing the finalizer (its default, 60 s, would keep a deleted resource a minute).
    settings.background.cancellation_polling = DAEMON_EXIT_POLL_S
    # Namespaced RBAC cannot watch namespaces or CRDs; the chart turns scanning off unless it adds a ClusterRole.
    settings.scanning.disabled = operator.scanning_disabled


@kopf.daemon(GROUP, VERSION, "checkpoints", backoff=5.0, when=unfinished)
async def checkpoint_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await checkpoint.run(stopped, body, context_of(memo))


@kopf.on.event(GROUP, VERSION, "checkpoints", when=ours)
async def checkpoint_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    expiry = memo.get("expiry")
    if isinstance(expiry, Expiry):
        expiry.observe(type, body)
    context = context_of(memo)
    context.seen("checkpoints", type, body)
    await release.drop_legacy_finalizer(context, "checkpoints", body)
    await backups.exclude(context, "checkpoints", body)


@kopf.on.delete(GROUP, VERSION, "checkpoints", backoff=2.0, when=needed_at_deletion)
async def checkpoint_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await deletion.checkpoint_deleted(body, retry, context_of(memo))


@kopf.daemon(GROUP, VERSION, "restores", backoff=5.0, when=unfinished)
async def restore_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await restore.run(stopped, body, context_of(memo))


@kopf.on.event(GROUP, VERSION, "restores", when=ours)
async def restore_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    context.seen("restores", type, body)
    await release.drop_legacy_finalizer(context, "restores", body)
    await backups.exclude(context, "restores", body)


@kopf.on.event(GROUP, VERSION, "checkpointschedules", when=ours)
async def schedule_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.scheduler.observe(type, body)


@kopf.on.event("", "v1", "pods", when=our_pod)
async def pod_event(body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    context = context_of(memo)
    pod = dict(body)
    await memo.terminations.notice(pod)
    if context.settings.auto_restore and namespace:
        if namespace not in memo.resumers:
            resumer = resume.Resumer(context, namespace)
            memo.resumers[namespace] = (resumer, asyncio.create_task(resumer.run(), name=f"resume {namespace}"))
        memo.resumers[namespace][0].poke()


@kopf.on.cleanup()
async def release_when_going_away(memo: kopf.Memo, **_: Any) -> None:
    stopping = memo.get("kopf_stop")
    if isinstance(stopping, asyncio.Event):  # kopf's stop flag (gym_operator.main): its waiter ends with kopf
        stopping.set()
    task = memo.get("expiry_task")
    if isinstance(task, asyncio.Task):
        task.cancel()
    for _resumer, resuming in (memo.get("resumers") or {}).values():
        resuming.cancel()
    if isinstance(memo.get("scheduler_task"), asyncio.Task):
        memo.scheduler_task.cancel()
    locations = memo.get("locations")
    if isinstance(locations, asyncio.Task):
        locations.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await locations
    context = memo.get("context")
    if isinstance(context, Context):  # (startup may have failed before there was one)
        await release.release_all(context)
