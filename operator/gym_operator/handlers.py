"""Every kopf handler of the operator, in one place: what kopf calls, on which resource, and the controller of
:mod:`gym_operator.controllers` (one module per lifecycle) that does the work.

- :func:`login` (``on.login``): the pod's service account, else the kubeconfig.
- :func:`startup` (``on.startup``): the settings, the Kubernetes client, the CRD check.
- :func:`checkpoint_daemon` (a ``daemon`` per Checkpoint): its transaction (:mod:`.controllers.checkpoint`).
- :func:`checkpoint_expiry` (a ``daemon`` per Checkpoint): once the transaction ended, ``spec.ttl``
  (:mod:`.controllers.deletion`).
- :func:`checkpoint_deleted` (``on.delete`` of a Checkpoint): its transaction cancelled, then its
  ``deletionPolicy`` (:mod:`.controllers.deletion`).
- :func:`restore_daemon` (a ``daemon`` per Restore): its transaction (:mod:`.controllers.restore`).
- :func:`schedule_seen` (``on.event`` of a CheckpointSchedule): one task runs every schedule of the release, its
  runs, keep and status (:mod:`.controllers.schedule`); no finalizer.
- :func:`pod_event` (``on.event`` of the release's participant pods): a terminating pod starts the termination
  checkpoint (:mod:`.controllers.termination`), and any change lets the automatic resume look at the stack
  (:mod:`.controllers.resume`, a task per namespace, started with the first pod seen there).
- :func:`release_when_going_away` (``on.cleanup``): the release uninstalled or its namespace deleted, the
  finalizers go (:mod:`.controllers.release`).

Run by ``gym-operator --namespace NS`` (:mod:`gym_operator.main`): leader election first, so only one replica of a
release's operator runs these handlers (:mod:`gym_operator.leadership`). Environment (:class:`OperatorSettings`):
``GYMCKPT_CONTROL_TOKEN`` (the Secret shared with the servers), ``GYMCKPT_STORAGE`` (the storage location
``default``), ``GYMCKPT_STORAGE_LOCATIONS`` (the admin's other locations: a spec names one, and can set no endpoint
or credentials), ``GYMCKPT_RELEASE`` (the release it serves: only resources whose ``spec.release`` names it, only
pods labelled ``app.kubernetes.io/instance=<release>``), ``AWS_*`` for S3.

- Several releases may share a namespace: each operator runs only its release's resources (the kopf filter
  :func:`ours`) on its release's pods, and leaves the others' alone (no finalizer, no Event).
- Watches end every ``GYMCKPT_WATCH_TIMEOUT_SECONDS`` (server side), and the client gives up on a stream that sent
  nothing for a little longer or on any watch or call past its own deadline: a half-open connection cannot stall
  the operator while its liveness probe stays green.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from gym_operator import crdcheck
from gym_operator.controllers import checkpoint, deletion, release, restore, resume, schedule, termination
from gym_operator.controllers.context import FINALIZER, Context, pod_selector
from gym_operator.discovery import selector_matches
from gym_operator.kube import GROUP, VERSION, Kube
from gym_operator.specs import OperatorSettings, SelectorSpec, SpecError

#: how often kopf checks whether a deleted resource's daemon has ended (then releases the finalizer)
DAEMON_EXIT_POLL_S = 0.5


def ours(spec: Any, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: a Checkpoint or Restore of this operator's release (``spec.release``, required by the CRDs)."""
    context = memo.get("context")
    return isinstance(context, Context) and (spec or {}).get("release") == context.settings.release


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
    kube = Kube.connect()
    await crdcheck.verify(kube)  # CRDs older than this operator: stop, naming the command that updates them
    context = Context(operator, kube, identity=str(memo.get("identity") or "restarted"))
    memo.context = context
    memo.terminations = termination.Terminations(context)
    memo.resumers = {}  # namespace -> (its Resumer, the task running it)
    memo.scheduler = schedule.Scheduler(context)
    memo.scheduler_task = asyncio.create_task(memo.scheduler.run(), name="checkpoint schedules")


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
    settings.persistence.finalizer = FINALIZER
    # A deleted resource's daemon ends within a second or so (it aborts, writes the outcome); kopf re-checks it
    # this often before releasing the finalizer (its default, 60 s, would keep a deleted resource a minute).
    settings.background.cancellation_polling = DAEMON_EXIT_POLL_S
    # Namespaced RBAC cannot watch namespaces or CRDs; the chart turns scanning off unless it adds a ClusterRole.
    settings.scanning.disabled = operator.scanning_disabled


@kopf.daemon(GROUP, VERSION, "checkpoints", backoff=5.0, when=ours)
async def checkpoint_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await checkpoint.run(stopped, body, context_of(memo))


@kopf.daemon(GROUP, VERSION, "checkpoints", backoff=5.0, when=ours)
async def checkpoint_expiry(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await deletion.expire(stopped, body, context_of(memo))


@kopf.on.delete(GROUP, VERSION, "checkpoints", backoff=2.0, when=ours)
async def checkpoint_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await deletion.checkpoint_deleted(body, retry, context_of(memo))


@kopf.daemon(GROUP, VERSION, "restores", backoff=5.0, when=ours)
async def restore_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await restore.run(stopped, body, context_of(memo))


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
    for _resumer, task in (memo.get("resumers") or {}).values():
        task.cancel()
    if isinstance(memo.get("scheduler_task"), asyncio.Task):
        memo.scheduler_task.cancel()
    context = memo.get("context")
    if isinstance(context, Context):  # (startup may have failed before there was one)
        await release.release_all(context)
