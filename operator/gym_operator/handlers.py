"""kopf handlers: each Checkpoint and Restore is a daemon running the coordinator against the stack's pods.

Run by ``gym-operator --namespace NS`` (:mod:`gym_operator.main`): leader election first, so only one
replica of a release's operator runs these handlers (:mod:`gym_operator.leader`). Environment:
``GYMCKPT_CONTROL_TOKEN`` (the Secret shared with the servers), ``GYMCKPT_STORAGE`` (the storage
location ``default``), ``GYMCKPT_STORAGE_LOCATIONS`` (the admin's other locations: a spec names one,
and can set no endpoint or credentials), ``GYMCKPT_RELEASE`` (the release it serves: only resources
whose ``spec.release`` names it, only pods labelled ``app.kubernetes.io/instance=<release>``),
``AWS_*`` for S3.

Why daemons: kopf handles one object's events one at a time, so a long ``on.create`` handler never
sees its object being deleted. A daemon runs beside the object's event handling; deleting the
object signals it (kopf's finalizer keeps the object until it exits), and the transaction is
cancelled: aborted at once, every server reopened (``docs/protocol.md``, "Kubernetes").

- Several releases may share a namespace: each operator runs only its release's resources (the kopf
  filter :func:`ours`) on its release's pods, and leaves the others' alone (no finalizer, no Event).
- One Checkpoint or Restore runs at a time per stack; a later one waits in ``Pending``.
- Status and Events are best-effort (:mod:`gym_operator.writer`, kopf's event poster): a failed
  write is retried, never changing what the transaction does.
- An operator restarted mid-transaction, or a standby that took the Lease from a dead leader, runs the
  daemon again: the coordinator is idempotent per checkpoint (and restore) id, so it finishes or aborts the
  same transaction (Event ``TakenOver``); the servers' leases cover the time no operator runs.
- Watches end every ``GYMCKPT_WATCH_TIMEOUT_SECONDS`` (server side), and the client gives up on a stream
  that sent nothing for a little longer or on any watch or call past its own deadline: a half-open
  connection cannot stall the operator while its liveness probe stays green.
- Retention: ``spec.ttl`` deletes the Checkpoint that long after its creation (``status.expiration``);
  deleting a Checkpoint removes its stored objects when ``spec.deletionPolicy`` is ``Delete``
  (:class:`gym_services.control.retention.Retention`), never while a Restore reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import kopf

from gym_operator import crdcheck
from gym_operator.discovery import (
    DiscoveryError,
    ReplicaCountMismatch,
    StackRolling,
    check_replica_counts,
    participants_from_pods,
    replicated_statefulsets,
    rollout_problems,
    selector_matches,
    selector_string,
    template_labels,
)
from gym_operator.kube import GROUP, VERSION, Kube, KubeError, Unavailable
from gym_operator.specs import (
    CheckpointSpec,
    DeletionPolicy,
    OperatorSettings,
    RestoreSpec,
    SelectorSpec,
    SpecError,
    StorageLocation,
    UnknownLocation,
)
from gym_operator.status import condition, failed_status, now, pending_status, progress_status, result_status
from gym_operator.writer import StatusWriter
from gym_services.base.backoff import Backoff
from gym_services.base.config import StorageConfig
from gym_services.control.models import StorageAccess
from gym_services.control.participant import InvalidState
from gym_services.control.retention import Retention
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionPhase, TransactionResult

S = TypeVar("S", CheckpointSpec, RestoreSpec)


class StackLock(asyncio.Lock):
    """One transaction at a time on a stack; ``holder`` names the one that runs (for those waiting)."""

    holder = "another transaction"


log = logging.getLogger("gym.operator")

FINALIZER = "gym-checkpoint.dev/operator"
FINAL = (TransactionPhase.COMPLETED, TransactionPhase.FAILED)
#: seconds the operator keeps retrying the Kubernetes API before a transaction starts
SETUP_PATIENCE_S = 120.0
#: how often setup asks again while it is told to wait (a pod not ready yet, ...)
SETUP_WAIT_POLL_S = 2.0
#: seconds a final status keeps being retried before the daemon gives up (a restarted operator writes it)
FINAL_WRITE_PATIENCE_S = 300.0
#: seconds a deleted Checkpoint's cleanup waits at once for its cancelled transaction (then it is retried)
CANCEL_PATIENCE_S = 60.0
#: how often kopf checks whether a deleted resource's daemon has ended (then releases the finalizer)
DAEMON_EXIT_POLL_S = 0.5
#: how often a Checkpoint waiting for its expiration re-reads its spec (kopf keeps the body live: no API call)
EXPIRY_POLL_S = 1.0


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.INFO  # INFO and up become Kubernetes Events
    settings.execution.max_workers = 4
    try:
        memo.settings = OperatorSettings.from_env()
    except SpecError as exc:
        raise kopf.PermanentError(str(exc)) from None
    # A watch the API server ends every watch_timeout_s; one that went silent (no event, no bookmark) for 10 s
    # longer, or lasted 30 s longer, is dropped by the client and re-opened from the last resourceVersion; a
    # list or call without an answer in 30 s is retried. A half-open connection then costs at most that long.
    watch = memo.settings.watch_timeout_s
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
    settings.scanning.disabled = memo.settings.scanning_disabled
    memo.kube = Kube.connect()
    await crdcheck.verify(memo.kube)  # CRDs older than this operator: stop, naming the command that updates them
    memo.locks = {}
    memo.running = {}  # resource uid -> an Event set once its transaction has ended
    memo.posted = {}  # (resource uid, reason) -> the message of the last Event posted with it
    memo.namespaces = set()  # where this operator's resources are (it may have put finalizers there)


def _event_once(memo: kopf.Memo, body: kopf.Body, reason: str, message: str, warning: bool = False) -> None:
    """An Event, unless the last one of this resource with this reason said the same: a handler kopf retries
    (a deletion waiting for a Restore, storage that keeps failing) would otherwise post a new Event each time."""
    key = ((body.get("metadata") or {}).get("uid"), reason)
    if memo.posted.get(key) == message:
        return
    memo.posted[key] = message
    (kopf.warn if warning else kopf.info)(body, reason=reason, message=message[:1024])


def ours(spec: Any, memo: kopf.Memo, **_: Any) -> bool:
    """kopf filter: a Checkpoint or Restore of this operator's release (``spec.release``, required by the CRDs)."""
    settings = getattr(memo, "settings", None)
    return settings is not None and (spec or {}).get("release") == settings.release


def _selector(selector: SelectorSpec, operator: OperatorSettings) -> str:
    return selector_string(
        selector.match_labels,
        operator.release,
        operator.selector,
        [e.requirement() for e in selector.match_expressions],
    )


async def _discover(namespace: str, selector: SelectorSpec, memo: kopf.Memo) -> list[ParticipantRef]:
    """The stack's participants; :class:`StackRolling` while a StatefulSet of it rolls out or a pod of it is
    not running (the caller waits), :class:`DiscoveryError` when it cannot be a stack."""
    labels = _selector(selector, memo.settings)
    pods = await memo.kube.list_pods(namespace, labels)
    statefulsets = [
        s for s in await memo.kube.list_statefulsets(namespace) if selector_matches(labels, template_labels(s))
    ]
    rolling = rollout_problems(statefulsets, pods)
    if rolling:
        raise StackRolling("; ".join(rolling))
    replicas = {str(s.metadata.name): 1 if s.spec.replicas is None else int(s.spec.replicas) for s in statefulsets}
    check_replica_counts(pods, {name: replicas.get(name) for name in replicated_statefulsets(pods)})
    refs = participants_from_pods(pods)
    if not refs:
        raise DiscoveryError(f"no participant pods match {labels!r} in {namespace}")
    return refs


async def _storage_access(
    location: StorageLocation, namespace: str, kube: Kube, operator: OperatorSettings
) -> tuple[StorageConfig, StorageAccess | None]:
    """How the operator reaches a storage location, and what the servers are told to use instead of their config.

    A location is the admin's (the chart's ``storage.locations``): its endpoint and region (else the operator's
    env) and the keys of its ``existingSecret`` (else the operator's). What the location names itself is also
    sent to every server with each transaction; ``default`` names nothing, so each server stays on the
    release's storage settings. No Checkpoint or Restore can name an endpoint or credentials.
    """
    keys: dict[str, str] = {}
    if location.existing_secret:
        data = await kube.secret_data(namespace, location.existing_secret)
        try:
            keys = {"access_key_id": data["AWS_ACCESS_KEY_ID"], "secret_access_key": data["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as exc:
            raise LookupError(f"Secret {location.existing_secret} has no {exc.args[0]}") from None
    named = {"endpoint_url": location.endpoint, "region": location.region, **keys}
    named = {k: v for k, v in named.items() if v}
    config = StorageConfig(
        endpoint_url=named.get("endpoint_url") or operator.endpoint_url,
        region=named.get("region") or operator.region,
        **keys,
    )
    return config, (StorageAccess(**named) if named else None)


def _location(name: str, operator: OperatorSettings) -> StorageLocation:
    try:
        return operator.location(name)
    except UnknownLocation as exc:
        raise Refused("UnknownStorageLocation", str(exc)) from None


class Refused(Exception):
    """The transaction cannot start; ends the resource in Failed with this reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Wait(Exception):
    """The transaction cannot start yet (its Checkpoint is not completed); it waits in Pending."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _deleted(stopped: kopf.DaemonStopped) -> bool:
    return bool(stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED)


class Transaction:
    """One Checkpoint or Restore resource: its status writer, events and the stack lock."""

    def __init__(
        self,
        kind: str,
        plural: str,
        selector: SelectorSpec,
        memo: kopf.Memo,
        body: kopf.Body,
    ) -> None:
        meta = body.get("metadata") or {}
        self.kind, self.plural = kind, plural
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.selector, self.memo, self.body = selector, memo, body
        memo.namespaces.add(self.namespace)
        status = dict(body.get("status") or {})
        self.writer = StatusWriter(memo.kube, plural, self.namespace, self.name, meta.get("generation"), status)
        self.fields: dict[str, Any] = {"startTime": status.get("startTime") or now()}
        self.cancelled = False
        self.rolling_since: float | None = None  # when discovery first found the stack rolling out

    @property
    def phase(self) -> str | None:
        return self.writer.status.get("phase")

    @property
    def final(self) -> bool:
        return self.phase in FINAL

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        """A Kubernetes Event on the resource (kopf posts it in the background, retrying)."""
        (kopf.warn if warning else kopf.info)(self.body, reason=reason, message=message[:1024])

    def fail(self, reason: str, message: str) -> None:
        self.writer.write(failed_status(reason, message, self.writer.generation, **self.fields))
        self.event(reason, message, warning=True)

    async def sink(self, phase: TransactionPhase, detail: dict[str, Any]) -> None:
        """Coordinator progress -> status phase and an Event (reason: the phase). Never blocks, never raises."""
        if phase.final:
            return  # the final status carries the outcome
        message = f"{phase.lower()}" + (f": {detail['error']}" if "error" in detail else "")
        self.writer.write(progress_status(phase, message, self.writer.generation, **self.fields))
        self.event(phase.value, message, warning=phase is TransactionPhase.ABORTING)

    def finish(self, result: TransactionResult) -> None:
        final = {**result_status(result, self.writer.generation), "startTime": self.fields["startTime"]}
        if not result.completed and self.cancelled:
            message = f"the {self.kind} was deleted before it completed; every participant touched was aborted"
            final = {
                **failed_status("Deleted", message, self.writer.generation, **self.fields),
                **{k: v for k, v in final.items() if k not in ("phase", "reason", "message", "conditions")},
            }
        self.writer.write(final)
        if result.completed:
            self.event("Completed", final["message"])
        else:
            self.event(final["reason"], final["message"], warning=True)

    async def coordinator(
        self, participants: list[ParticipantRef], storage: StorageLocation, client: ControlClient
    ) -> Coordinator:
        try:
            storage_config, access = await _storage_access(storage, self.namespace, self.memo.kube, self.memo.settings)
        except LookupError as exc:
            raise Refused("CredentialsNotFound", str(exc)) from None
        return Coordinator(
            participants, client, storage_config=storage_config, participant_storage=access, on_event=self.sink
        )

    async def participants(self) -> list[ParticipantRef]:
        """The stack's pods; while they roll out (a ``helm upgrade``, a pod replaced), wait in Pending with reason
        ``WaitingForRollout`` for at most the operator's rollout patience, then fail with reason ``StackRolling``."""
        loop = asyncio.get_running_loop()
        try:
            found = await _discover(self.namespace, self.selector, self.memo)
        except StackRolling as exc:
            self.rolling_since = self.rolling_since or loop.time()
            patience = self.memo.settings.rollout_patience_s
            if loop.time() - self.rolling_since > patience:
                raise Refused(
                    "StackRolling", f"the stack did not settle in {patience:g}s: {exc}; try again once it has"
                ) from None
            raise Wait("WaitingForRollout", f"waiting for the stack's pods to settle: {exc}") from None
        except ReplicaCountMismatch as exc:
            raise Refused("ReplicaCountMismatch", str(exc)) from None
        except DiscoveryError as exc:
            raise Refused("NoParticipants", str(exc)) from None
        if self.rolling_since is not None:
            self.event("Settled", f"the stack's pods settled: {len(found)} participants")
        return found

    async def _setup(self, stopped: kopf.DaemonStopped, setup: Callable[[], Awaitable[Any]]) -> Any:
        """``setup`` (reads from the Kubernetes API, nothing sent to a server yet), retried while the API does
        not answer or while it says to wait; None when stopped meanwhile."""
        api = Backoff(0.5, 10.0, SETUP_PATIENCE_S)
        while not stopped.is_set():
            try:
                return await setup()
            except Unavailable as exc:
                if not api.failed():
                    raise Refused(
                        "KubernetesAPIError", f"the Kubernetes API did not answer for {api.failing_s:.0f}s: {exc}"
                    ) from None
                delay = api.wait_s()
                log.warning(f"{self.kind} {self.name}: {exc}; retrying in {delay:.1f}s")
            except Wait as exc:
                api.reset()  # the API answered
                if self.writer.status.get("message") != exc.message:
                    self.writer.write(pending_status(exc.reason, exc.message, self.writer.generation))
                    self.event("Waiting", exc.message)
                delay = SETUP_WAIT_POLL_S
            await stopped.wait(delay)
        return None

    async def run(
        self,
        stopped: kopf.DaemonStopped,
        setup: Callable[[], Awaitable[Any]],
        work: Callable[[Any, asyncio.Event], Coroutine[Any, Any, TransactionResult]],
    ) -> None:
        """Wait for the stack (Pending), ``setup``, then ``work`` holding the stack's lock.

        Deleting the resource sets the cancel event ``work`` receives (the coordinator aborts); the
        operator stopping interrupts ``work`` without aborting (a restarted operator repeats it).
        """
        key = f"{self.namespace}/{_selector(self.selector, self.memo.settings)}"
        lock: StackLock = self.memo.locks.setdefault(key, StackLock())
        while lock.locked() and not stopped.is_set():
            message = f"waiting: {lock.holder} is running on this stack"
            if self.writer.status.get("message") != message:
                self.writer.write(pending_status("WaitingForStack", message, self.writer.generation))
                self.event("Waiting", message)
            await stopped.wait(1.0)
        if stopped.is_set():
            if _deleted(stopped):
                self.cancelled = True
                self.fail("Deleted", f"the {self.kind} was deleted before it started")
            return
        async with lock:
            lock.holder = f"{self.kind} {self.name}"
            try:
                prepared = await self._setup(stopped, setup)
                if prepared is None:
                    if _deleted(stopped):
                        self.cancelled = True
                        self.fail("Deleted", f"the {self.kind} was deleted before it started")
                    return
                cancel = asyncio.Event()
                task = asyncio.create_task(work(prepared, cancel), name=f"{self.kind} {self.name}")
                stop = asyncio.ensure_future(stopped.wait())
                try:
                    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                if not task.done():
                    if _deleted(stopped):
                        self.cancelled = True
                        cancel.set()  # the coordinator aborts what it touched and returns a failed result
                    else:
                        task.cancel()  # the operator stops: leave the servers to the next operator or their leases
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                        log.info(f"{self.kind} {self.name}: interrupted, the operator is stopping")
                        return
                self.finish(await task)
            except Refused as exc:
                self.fail(exc.reason, exc.message)
            except StorageError as exc:
                self.fail("StorageError", str(exc))
            except KubeError as exc:
                self.fail("KubernetesAPIError", str(exc))

    async def settle(self, stopped: kopf.DaemonStopped) -> None:
        """Wait until the status written so far is in (retrying), or the resource is gone, or the operator stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FINAL_WRITE_PATIENCE_S
        while not await self.writer.flush(timeout_s=1.0):
            if self.writer.gone or loop.time() > deadline:
                break
            if stopped.is_set() and not _deleted(stopped):
                break
        if not self.writer.gone and self.writer.status != self.writer.written:
            log.error(f"{self.kind} {self.name}: its status could not be written; a restarted operator writes it")
        await self.writer.close()


def _parse(model: type[S], spec: Any) -> tuple[S | None, str]:
    """The parsed spec, or None and why (the transaction then fails with reason InvalidSpec)."""
    try:
        return model.parse(spec), ""
    except SpecError as exc:
        return None, str(exc)


def _invalid(invalid: str) -> Callable[[], Awaitable[Any]]:
    async def setup() -> Any:
        raise Refused("InvalidSpec", invalid)

    return setup


async def _daemon(tx: Transaction, stopped: kopf.DaemonStopped, setup, work) -> None:
    """Run a transaction once (a final one is not run again), then settle its status."""
    done = tx.memo.running.setdefault(tx.uid, asyncio.Event())
    done.clear()
    left = tx.phase
    if left is not None and left not in FINAL and left != TransactionPhase.PENDING:
        # an earlier operator (a leader that died, or this process before a restart) left it mid-transaction
        message = (
            f"carrying on the {tx.kind} an earlier operator left in {left}: the same transaction id, so "
            f"what the servers already did is not done again (operator {tx.memo.get('identity', 'restarted')})"
        )
        log.info(f"{tx.kind} {tx.name}: {message}")
        tx.event("TakenOver", message)
    try:
        if not tx.final:
            await tx.run(stopped, setup, work)
        await tx.settle(stopped)
    finally:
        done.set()


# --- Checkpoint ------------------------------------------------------------------------------


@kopf.daemon(GROUP, VERSION, "checkpoints", backoff=5.0, when=ours)
async def checkpoint_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    parsed, invalid = _parse(CheckpointSpec, body.get("spec"))
    tx = Transaction("Checkpoint", "checkpoints", parsed.selector if parsed else SelectorSpec(), memo, body)
    name, uid = tx.name, tx.uid

    async def setup() -> tuple[str, StorageLocation, list[ParticipantRef]]:
        assert parsed is not None
        return f"{name}-{uid[:8]}", _location(parsed.storage_location, memo.settings), await tx.participants()

    async def work(
        prepared: tuple[str, StorageLocation, list[ParticipantRef]], cancel: asyncio.Event
    ) -> TransactionResult:
        assert parsed is not None
        checkpoint_id, storage, participants = prepared
        location = storage.url
        tx.fields.update(checkpointId=checkpoint_id, location=location)
        async with ControlClient(
            memo.settings.token, timeout_s=memo.settings.checkpoint_call_timeout(parsed)
        ) as client:
            coordinator = await tx.coordinator(participants, storage, client)
            # the resource's uid names the transaction: an operator restarted mid-checkpoint repeats the same one, and
            # a Checkpoint re-created under a deleted one's name is another transaction, refused if its id is taken
            return await coordinator.checkpoint(
                checkpoint_id,
                location,
                prepare_timeout_s=parsed.prepare_timeout_seconds,
                lease_s=parsed.lease_seconds,
                transaction_id=uid,
                claimed_by=f"Checkpoint {tx.namespace}/{name}",
                method=parsed.method,
                cancel=cancel,
            )

    await _daemon(tx, stopped, setup if parsed else _invalid(invalid), work)
    if parsed is not None:
        await _expire(tx, stopped, body)


def _expiration(body: kopf.Body) -> dt.datetime | None:
    """When the Checkpoint expires: its creation plus ``spec.ttl`` (read from the live body: ttl may change)."""
    try:
        ttl = CheckpointSpec.parse(body.get("spec")).ttl
    except SpecError:
        return None
    created = (body.get("metadata") or {}).get("creationTimestamp")
    if ttl is None or not created:
        return None
    return dt.datetime.fromisoformat(created.replace("Z", "+00:00")) + ttl


async def _expire(tx: Transaction, stopped: kopf.DaemonStopped, body: kopf.Body) -> None:
    """Keep ``status.expiration`` up to date with ``spec.ttl``; once it passes, delete the Checkpoint (its
    ``deletionPolicy`` then decides what happens to the stored objects)."""
    written = (body.get("status") or {}).get("expiration")
    while not stopped.is_set():
        expiration = _expiration(body)
        stamp = expiration.strftime("%Y-%m-%dT%H:%M:%SZ") if expiration else None
        if stamp != written:
            generation = (body.get("metadata") or {}).get("generation")
            writer = StatusWriter(tx.memo.kube, "checkpoints", tx.namespace, tx.name, generation, None)
            writer.write({"expiration": stamp})
            await writer.flush(timeout_s=30.0)
            await writer.close()
            written = stamp
        if expiration is None:
            await stopped.wait(EXPIRY_POLL_S)
            continue
        left = (expiration - dt.datetime.now(dt.UTC)).total_seconds()
        if left > 0:
            await stopped.wait(min(left, EXPIRY_POLL_S))
            continue
        tx.event("Expired", f"spec.ttl ran out at {stamp}: deleting the Checkpoint")
        try:
            await tx.memo.kube.delete_object("checkpoints", tx.namespace, tx.name, tx.uid)
        except KubeError as exc:
            log.warning(f"Checkpoint {tx.name}: expired, but deleting it failed ({exc}); retrying")
            await stopped.wait(5.0)
            continue
        await stopped.wait()  # the deletion stops this daemon


def _restore_reads(restore: dict[str, Any], name: str, checkpoint_id: str | None, location: str) -> bool:
    """Whether a Restore that has not ended reads this Checkpoint (by name, or by id and storage location)."""
    if (restore.get("status") or {}).get("phase") in FINAL:
        return False
    spec = restore.get("spec") or {}
    if (spec.get("checkpointRef") or {}).get("name") == name:
        return True
    return (
        bool(checkpoint_id)
        and spec.get("checkpointId") == checkpoint_id
        and spec.get("storageLocation", "default") == location
    )


@kopf.on.delete(GROUP, VERSION, "checkpoints", backoff=2.0, when=ours)
async def checkpoint_deleted(
    spec: Any,
    status: Any,
    name: str,
    namespace: str | None,
    uid: str,
    memo: kopf.Memo,
    body: kopf.Body,
    retry: int,
    **_: Any,
) -> None:
    """A deleted Checkpoint: its transaction is cancelled first (the daemon aborts it); then, with
    ``deletionPolicy: Delete``, its stored objects are removed once no Restore reads them. Storage that keeps
    failing is tried ``GYMCKPT_DELETE_ATTEMPTS`` times (delays doubling), then the data is kept: one ``DataKept``
    Warning and the ``DataDeleted=False`` condition say so, and the Checkpoint goes."""
    assert namespace is not None  # Checkpoints are namespaced
    memo.namespaces.add(namespace)
    running = memo.running.get(uid)
    if running is not None and not running.is_set():
        try:  # the daemon was told (kopf stops daemons first): it aborts, writes the outcome, and ends
            await asyncio.wait_for(running.wait(), timeout=CANCEL_PATIENCE_S)
        except TimeoutError:
            raise kopf.TemporaryError("waiting for its transaction to be cancelled", delay=1) from None
    status = dict(status or {})
    checkpoint_id, location = status.get("checkpointId"), status.get("location")
    try:
        parsed = CheckpointSpec.parse(spec)
    except SpecError:
        return  # nothing the operator wrote can be found from an invalid spec
    if status.get("phase") not in FINAL and running is None and checkpoint_id:
        await _abort_orphan(parsed.selector, namespace, checkpoint_id, memo)
    if parsed.deletion_policy is DeletionPolicy.RETAIN or not checkpoint_id or not location:
        return
    readers = [
        r["metadata"]["name"]
        for r in await memo.kube.list_objects("restores", namespace)
        if _restore_reads(r, name, checkpoint_id, parsed.storage_location)
    ]
    if readers:
        message = f"not deleting checkpoint {checkpoint_id} while Restore {', '.join(sorted(readers))} reads it"
        _event_once(memo, body, "WaitingForRestore", message)
        raise kopf.TemporaryError(message, delay=2)
    try:
        storage = memo.settings.location(parsed.storage_location)
    except UnknownLocation as exc:
        kopf.warn(
            body, reason="DataKept", message=f"not deleting checkpoint {checkpoint_id} at {location}: {exc}"[:1024]
        )
        return  # the admin removed the location: nothing this operator can reach, and nothing to wait for
    try:
        config, _access = await _storage_access(storage, namespace, memo.kube, memo.settings)
        # the transaction is over (cancelled above, or its operator gone): never published later, so an
        # unpublished checkpoint of it is abandoned, not in flight
        deleted = await asyncio.to_thread(
            functools.partial(
                Retention(CheckpointStore(open_storage(location, config))).delete,
                checkpoint_id,
                abandoned=True,
                by=f"Checkpoint {namespace}/{name}",
            )
        )
    except (StorageError, LookupError, Refused, InvalidState) as exc:
        attempts = memo.settings.delete_attempts
        if retry + 1 >= attempts:
            # storage gone for good must not hold the Checkpoint (and its namespace, its CRD) forever
            message = (
                f"deleting checkpoint {checkpoint_id} at {location} failed {attempts} times ({exc}); the data is "
                f"kept and the Checkpoint goes: remove it with `gymckpt checkpoints delete {checkpoint_id} --storage "
                f"{location}` once the storage answers"
            )
            await _data_condition(memo, body, status, "DataKept", message)
            kopf.warn(body, reason="DataKept", message=message[:1024])
            return
        message = (
            f"deleting checkpoint {checkpoint_id} at {location} failed (attempt {retry + 1} of {attempts}): {exc}; "
            "retrying (set spec.deletionPolicy: Retain to keep it)"
        )
        if retry == 0:
            await _data_condition(memo, body, status, "DeleteFailed", message)
        _event_once(
            memo,
            body,
            "DeleteFailed",
            f"deleting checkpoint {checkpoint_id} at {location} failed: {exc}; trying {attempts} times in all "
            "(set spec.deletionPolicy: Retain to keep it)",
            warning=True,
        )
        # doubling from GYMCKPT_DELETE_RETRY_SECONDS (10 s: 10, 20, 40, ... at most 10 min apart), then given up
        raise kopf.TemporaryError(message, delay=min(memo.settings.delete_retry_s * 2 ** min(retry, 6), 600)) from None
    kopf.info(
        body,
        reason="DataDeleted",
        message=f"deleted checkpoint {checkpoint_id} at {location}: {deleted.objects} objects",
    )


async def _data_condition(memo: kopf.Memo, body: kopf.Body, status: dict[str, Any], reason: str, message: str) -> None:
    """The ``DataDeleted=False`` condition of a deleted Checkpoint whose data could not be deleted (best effort)."""
    meta = body.get("metadata") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DataDeleted"]
    conditions.append(condition("DataDeleted", False, reason, message, meta.get("generation")))
    try:
        await memo.kube.patch_status("checkpoints", meta["namespace"], meta["name"], {"conditions": conditions})
    except KubeError as exc:
        log.warning(f"Checkpoint {meta['name']}: could not write the DataDeleted condition ({exc})")


@kopf.on.cleanup()
async def release_when_going_away(memo: kopf.Memo, **_: Any) -> None:
    """The operator stops. If its release is going away - its Deployment is gone or being deleted (``helm
    uninstall``), or its namespace is terminating - nothing will ever run its handlers again: it takes its finalizer
    off every Checkpoint and Restore of the release, so deleting them, their CRDs or the namespace completes. (An
    operator that stops for an upgrade, a restart or an eviction keeps them: the next one handles the deletions.)
    A Checkpoint with ``deletionPolicy: Delete`` keeps its stored objects then (one ``DataKept`` Warning says so).
    Its daemons have stopped by now: the servers' leases end any transaction that was running."""
    settings = getattr(memo, "settings", None)
    kube = getattr(memo, "kube", None)
    if settings is None or kube is None:
        return
    for namespace in sorted(getattr(memo, "namespaces", ())):  # where it put finalizers: where its resources are
        await _release_namespace(kube, settings, namespace)


async def _release_namespace(kube: Kube, settings: OperatorSettings, namespace: str) -> None:
    why = None
    if await kube.deletion_started("namespace", namespace, namespace):
        why = f"namespace {namespace} is being deleted"
    elif settings.deployment and await kube.deletion_started("deployment", namespace, settings.deployment):
        why = f"Deployment {settings.deployment} is gone (the release was uninstalled)"
    if why is None:
        return
    released = []
    for plural in ("checkpoints", "restores"):
        try:
            found = await kube.list_objects(plural, namespace)
        except KubeError as exc:
            log.warning(f"{why}, but listing {plural} failed ({exc}); their finalizers stay")
            continue
        for obj in found:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            if spec.get("release") != settings.release or FINALIZER not in (meta.get("finalizers") or []):
                continue
            status = obj.get("status") or {}
            if plural == "checkpoints" and spec.get("deletionPolicy") == "Delete" and status.get("checkpointId"):
                message = (
                    f"{why}: the operator stops for good and lets the Checkpoint go without deleting checkpoint "
                    f"{status['checkpointId']} at {status.get('location')} (`gymckpt checkpoints delete "
                    f"{status['checkpointId']} --storage {status.get('location')}` removes it)"
                )
                log.warning(message)
                try:
                    await kube.warn(obj, "DataKept", message)
                except KubeError as exc:  # (a terminating namespace takes no new Events)
                    log.warning(f"could not post the DataKept Event: {exc}")
            for _attempt in range(5):
                try:
                    if await kube.remove_finalizer(plural, namespace, meta["name"], FINALIZER):
                        released.append(f"{plural}/{meta['name']}")
                    break
                except KubeError as exc:
                    log.warning(f"releasing {plural}/{meta['name']}: {exc}; retrying")
                    await asyncio.sleep(0.5)
    log.info(f"{why}: released the finalizers of {', '.join(released) or 'nothing'}")


async def _abort_orphan(selector: SelectorSpec, namespace: str, checkpoint_id: str, memo: kopf.Memo) -> None:
    """A Checkpoint deleted mid-transaction while no daemon of this operator ran it (the operator was down):
    abort its id on every participant, so none waits for its lease."""
    try:
        participants = await _discover(namespace, selector, memo)
    except (DiscoveryError, KubeError):
        return
    async with ControlClient(memo.settings.token, timeout_s=10.0) as client:
        await Coordinator(participants, client).abort_all(checkpoint_id, participants)


# --- Restore ---------------------------------------------------------------------------------


@kopf.daemon(GROUP, VERSION, "restores", backoff=5.0, when=ours)
async def restore_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    parsed, invalid = _parse(RestoreSpec, body.get("spec"))
    tx = Transaction("Restore", "restores", parsed.selector if parsed else SelectorSpec(), memo, body)

    async def setup() -> tuple[str, StorageLocation, list[ParticipantRef]]:
        assert parsed is not None
        checkpoint_id, storage = await _restore_source(parsed, tx.namespace, memo)
        return checkpoint_id, storage, await tx.participants()

    async def work(
        prepared: tuple[str, StorageLocation, list[ParticipantRef]], cancel: asyncio.Event
    ) -> TransactionResult:
        assert parsed is not None
        checkpoint_id, storage, participants = prepared
        location = storage.url
        tx.fields.update(checkpointId=checkpoint_id, location=location)
        async with ControlClient(memo.settings.token, timeout_s=memo.settings.restore_call_timeout_s) as client:
            coordinator = await tx.coordinator(participants, storage, client)
            # the resource's uid names the transaction: an operator restarted mid-restore repeats the same one
            return await coordinator.restore(
                checkpoint_id, location, lease_s=parsed.lease_seconds, restore_id=tx.uid, cancel=cancel
            )

    await _daemon(tx, stopped, setup if parsed else _invalid(invalid), work)


async def _restore_source(spec: RestoreSpec, namespace: str, memo: kopf.Memo) -> tuple[str, StorageLocation]:
    """Checkpoint id and storage location a Restore names (directly or by Checkpoint)."""
    if spec.checkpoint_ref is None:
        if not spec.checkpoint_id:
            raise Refused("InvalidSpec", "set checkpointRef.name, or checkpointId (with storageLocation)")
        return spec.checkpoint_id, _location(spec.storage_location, memo.settings)
    ref = spec.checkpoint_ref.name
    source = await memo.kube.get_object("checkpoints", namespace, ref)
    if source is None:
        raise Refused("CheckpointNotFound", f"Checkpoint {ref} does not exist in {namespace}")
    if (source.get("metadata") or {}).get("deletionTimestamp"):
        raise Refused("CheckpointDeleted", f"Checkpoint {ref} is being deleted; nothing to restore")
    source_status = source.get("status") or {}
    if (source.get("spec") or {}).get("release") != spec.release:
        raise Refused(
            "CheckpointOfAnotherRelease",
            f"Checkpoint {ref} belongs to release "
            f"{(source.get('spec') or {}).get('release')}, not {spec.release}; restore a Checkpoint of this release",
        )
    if source_status.get("phase") == TransactionPhase.FAILED:
        raise Refused("CheckpointFailed", f"Checkpoint {ref} failed; nothing to restore")
    if source_status.get("phase") != TransactionPhase.COMPLETED:
        raise Wait("WaitingForCheckpoint", f"waiting: Checkpoint {ref} is not completed yet")
    try:
        checkpointed = CheckpointSpec.parse(source.get("spec"))
    except SpecError as exc:
        raise Refused("InvalidSpec", f"Checkpoint {ref}: {exc}") from None
    storage = _location(checkpointed.storage_location, memo.settings)
    if source_status.get("location") != storage.url:
        raise Refused(
            "StorageLocationChanged",
            f"Checkpoint {ref} was written to {source_status.get('location')}, but "
            f"storage location {storage.name} is now {storage.url}; restore it by checkpointId from a "
            "location that holds it",
        )
    return source_status["checkpointId"], storage
