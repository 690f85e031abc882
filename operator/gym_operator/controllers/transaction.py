"""The daemon of one Checkpoint or Restore: wait for the stack, set up, run the coordinator, write the outcome.

Why daemons: kopf handles one object's events one at a time, so a long ``on.create`` handler never sees its object
being deleted. A daemon runs beside the object's event handling; deleting the object signals it (kopf's finalizer
keeps the object until it exits), and the transaction is cancelled: aborted at once, every server reopened
(``docs/protocol.md``, "Kubernetes").

- One Checkpoint or Restore runs at a time per stack; a later one waits in ``Pending``.
- Status and Events are best-effort (:mod:`gym_operator.writer`, kopf's event poster): a failed write is retried,
  never changing what the transaction does.
- An operator restarted mid-transaction, or a standby that took the Kubernetes Lease from a dead leader, runs the
  daemon again: the coordinator is idempotent per checkpoint (and restore) id, so it finishes or aborts the same
  transaction (Event ``TakenOver``); the servers' pause leases cover the time no operator runs.

:mod:`.checkpoint` and :mod:`.restore` each give :func:`run_once` what differs: how to set up (find the checkpoint,
the storage location, the participants) and the coordinator call.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import kopf

from gym_operator.controllers.backups import restored_by_velero
from gym_operator.controllers.context import FINAL, Context, Refused, StackLock, Wait, discover
from gym_operator.controllers.location import storage_config
from gym_operator.discovery import DiscoveryError, ReplicaCountMismatch, StackRolling
from gym_operator.kube import KubeError, Unavailable
from gym_operator.metrics import METRICS
from gym_operator.specs import CheckpointSpec, RestoreSpec, SelectorSpec, SpecError, StorageLocation
from gym_operator.status import failed_status, now, pending_status, progress_status, result_status
from gym_operator.writer import StatusWriter
from gym_services.base.backoff import Backoff
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.storage.gateway import GrantIssuer, GrantSigner, Target
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionPhase, TransactionResult

log = logging.getLogger("gym.operator")

S = TypeVar("S", CheckpointSpec, RestoreSpec)
P = TypeVar("P")

#: seconds the operator keeps retrying the Kubernetes API before a transaction starts
SETUP_PATIENCE_S = 120.0
#: how often setup asks again while it is told to wait (a pod not ready yet, ...)
SETUP_WAIT_POLL_S = 2.0
#: seconds a final status keeps being retried before the daemon gives up (a restarted operator writes it)
FINAL_WRITE_PATIENCE_S = 300.0

Setup = Callable[[], Awaitable[P]]
Work = Callable[[P, asyncio.Event], Coroutine[Any, Any, TransactionResult]]


def deleted(stopped: kopf.DaemonStopped) -> bool:
    """Whether a daemon was stopped because its resource was deleted (not because the operator stops)."""
    return bool(stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED)


class Transaction(Generic[P]):
    """One Checkpoint or Restore resource: its status writer, events and the stack lock."""

    def __init__(
        self,
        kind: str,
        plural: str,
        selector: SelectorSpec,
        context: Context,
        body: kopf.Body,
        final: bool = False,
        deadline: dt.datetime | None = None,
    ) -> None:
        meta = body.get("metadata") or {}
        self.kind, self.plural = kind, plural
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.selector, self.context, self.body = selector, context, body
        context.namespaces.add(self.namespace)
        status = dict(body.get("status") or {})
        self.writer = StatusWriter(
            context.kube,
            plural,
            self.namespace,
            self.name,
            meta.get("generation"),
            status,
            fence=context.fence,
            version=lambda: (body.get("metadata") or {}).get("resourceVersion"),
        )
        self.fields: dict[str, Any] = {"startTime": status.get("startTime") or now()}
        self.cancelled = False
        self.rolling_since: float | None = None  # when discovery first found the stack rolling out
        self.started = time.monotonic()
        #: a final (termination) checkpoint: it goes before the stack's non-final transactions that wait, and
        #: takes pods that are being deleted
        self.final_checkpoint = final
        #: when it must have been published by (a termination checkpoint's: the servers stop holding then)
        self.deadline = deadline
        self.deadline_passed = False

    @property
    def phase(self) -> str | None:
        phase = self.writer.status.get("phase")
        return None if phase is None else str(phase)

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

    def left_s(self) -> float:
        """Seconds to the deadline (infinite without one)."""
        if self.deadline is None:
            return float("inf")
        return (self.deadline - dt.datetime.now(dt.UTC)).total_seconds()

    def check_deadline(self, doing: str) -> None:
        if self.left_s() <= 0:
            assert self.deadline is not None
            stamp = self.deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            raise Refused("DeadlinePassed", f"the deadline ({stamp}) passed while {doing}; nothing was paused")

    def finish(self, result: TransactionResult) -> None:
        METRICS.transaction(self.context.settings.release, result, time.monotonic() - self.started)
        final = {**result_status(result, self.writer.generation), "startTime": self.fields["startTime"]}
        if not result.completed and self.deadline_passed:
            assert self.deadline is not None
            message = (
                f"not published by its deadline ({self.deadline.strftime('%Y-%m-%dT%H:%M:%SZ')}): aborted, nothing "
                f"was published ({result.error or 'failed'}); the stack resumes from the newest checkpoint before it"
            )
            final = {
                **failed_status("DeadlinePassed", message, self.writer.generation, **self.fields),
                **{k: v for k, v in final.items() if k not in ("phase", "reason", "message", "conditions")},
            }
        elif not result.completed and self.cancelled:
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
        self,
        participants: list[ParticipantRef],
        storage: StorageLocation,
        client: ControlClient,
        decisions: StorageLocation | None = None,
    ) -> Coordinator:
        """The coordinator of this transaction: the operator reaches the location with its keys, and each server
        with a grant of the storage gateway (:func:`grants`), never with keys."""
        try:
            config = await storage_config(storage, self.namespace, self.context)
        except LookupError as exc:
            raise Refused("CredentialsNotFound", str(exc)) from None
        return Coordinator(
            participants,
            client,
            storage_config=config,
            grants=grants(storage, decisions, self.context),
            on_event=self.sink,
        )

    async def decision_store(self, decisions: StorageLocation | None) -> CheckpointStore | None:
        """The store of a restore's decision object when it is not at the checkpoint's location."""
        if decisions is None:
            return None
        try:
            config = await storage_config(decisions, self.namespace, self.context)
        except LookupError as exc:
            raise Refused("CredentialsNotFound", str(exc)) from None
        return CheckpointStore(open_storage(decisions.url, config))

    async def participants(self) -> list[ParticipantRef]:
        """The stack's pods; while they roll out (a ``helm upgrade``, a pod replaced), wait in Pending with reason
        ``WaitingForRollout`` for at most the operator's rollout patience, then fail with reason ``StackRolling``.
        A final checkpoint takes pods that are being deleted and never waits: a pod that is not running fails it."""
        loop = asyncio.get_running_loop()
        try:
            found = await discover(self.namespace, self.selector, self.context, terminating_ok=self.final_checkpoint)
        except StackRolling as exc:
            if self.final_checkpoint:
                raise Refused("StackIncomplete", f"a final checkpoint cannot wait for the stack: {exc}") from None
            self.rolling_since = self.rolling_since or loop.time()
            patience = self.context.settings.rollout_patience_s
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

    async def _setup(self, stopped: kopf.DaemonStopped, setup: Setup[P]) -> P | None:
        """``setup`` (reads from the Kubernetes API, nothing sent to a server yet), retried while the API does
        not answer or while it says to wait; None when stopped meanwhile."""
        api = Backoff(0.5, 10.0, SETUP_PATIENCE_S)
        while not stopped.is_set():
            self.check_deadline("setting up")
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
                self._superseded(lock_of(self))
                api.reset()  # the API answered
                if self.writer.status.get("message") != exc.message:
                    self.writer.write(pending_status(exc.reason, exc.message, self.writer.generation))
                    self.event("Waiting", exc.message)
                delay = SETUP_WAIT_POLL_S
            await stopped.wait(delay)
        return None

    def _superseded(self, lock: StackLock) -> None:
        """A checkpoint that has not started gives way to a final (termination) checkpoint of its stack: that one
        takes the stack's last state, and after it the participants hold it until they exit."""
        if self.kind == "Checkpoint" and not self.final_checkpoint and lock.finals:
            name = sorted(lock.finals)[0]
            raise Refused("Superseded", f"the termination checkpoint {name} takes the stack's state instead")

    async def _wait_for_stack(self, stopped: kopf.DaemonStopped, lock: StackLock) -> None:
        """Pending (reason ``WaitingForStack``) while another transaction runs on the stack, or, for all but a
        final checkpoint, while a final one waits for it."""
        while (lock.locked() or (lock.finals and not self.final_checkpoint)) and not stopped.is_set():
            self._superseded(lock)
            self.check_deadline(f"waiting for {lock.holder}")
            message = f"waiting: {lock.holder} is running on this stack"
            if self.writer.status.get("message") != message:
                self.writer.write(pending_status("WaitingForStack", message, self.writer.generation))
                self.event("Waiting", message)
            await stopped.wait(1.0)

    def _deleted_before_start(self, stopped: kopf.DaemonStopped) -> None:
        if deleted(stopped):
            self.cancelled = True
            self.fail("Deleted", f"the {self.kind} was deleted before it started")

    async def run(self, stopped: kopf.DaemonStopped, setup: Setup[P], work: Work[P]) -> None:
        """Wait for the stack (Pending), ``setup``, then ``work`` holding the stack's lock.

        Deleting the resource sets the cancel event ``work`` receives (the coordinator aborts); the
        operator stopping interrupts ``work`` without aborting (a restarted operator repeats it).
        """
        lock = lock_of(self)
        if self.final_checkpoint:
            lock.finals.add(self.name)
        try:
            await self._wait_for_stack(stopped, lock)
        except Refused as exc:
            self.fail(exc.reason, exc.message)
            return
        finally:
            lock.finals.discard(self.name)
        if stopped.is_set():
            self._deleted_before_start(stopped)
            return
        async with lock:
            lock.holder = f"{self.kind} {self.name}"
            try:
                prepared = await self._setup(stopped, setup)
                if prepared is None:
                    self._deleted_before_start(stopped)
                    return
                cancel = asyncio.Event()
                task = asyncio.create_task(work(prepared, cancel), name=f"{self.kind} {self.name}")
                stop = asyncio.ensure_future(stopped.wait())
                try:
                    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                if not task.done():
                    if deleted(stopped):
                        self.cancelled = True
                        cancel.set()  # the coordinator aborts what it touched and returns a failed result
                    else:
                        task.cancel()  # the operator stops: the next operator, or the pause leases, end it
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
            if stopped.is_set() and not deleted(stopped):
                break
        if not self.writer.gone and self.writer.status != self.writer.written:
            log.error(f"{self.kind} {self.name}: its status could not be written; a restarted operator writes it")
        await self.writer.close()


def target(location: StorageLocation) -> Target:
    return Target(url=location.url, endpoint=location.endpoint, region=location.region, credential=location.credential)


def grants(storage: StorageLocation, decisions: StorageLocation | None, context: Context) -> GrantIssuer | None:
    """The servers' storage grants for a transaction at ``storage`` (``docs/decisions.md``, "Participants reach storage
    through presigned requests"); None when the operator runs no storage gateway (``GYMCKPT_GATEWAY_KEY`` unset: each
    server then uses its own storage config) or the location is no ``s3://`` one (a ``file://`` location is a
    volume every pod mounts)."""
    key = context.settings.gateway_key
    if key is None or not storage.url.startswith("s3://"):
        return None
    return GrantIssuer(
        GrantSigner(key.get_secret_value().encode()),
        target(storage),
        target(decisions) if decisions is not None else None,
    )


def lock_of(tx: Transaction[Any]) -> StackLock:
    """The lock of the transaction's stack (one transaction at a time on it)."""
    return tx.context.locks.setdefault(tx.context.stack_key(tx.namespace, tx.selector), StackLock())


def parse(model: type[S], spec: Any) -> tuple[S | None, str]:
    """The parsed spec, or None and why (the transaction then fails with reason InvalidSpec)."""
    try:
        return model.parse(spec), ""
    except SpecError as exc:
        return None, str(exc)


def invalid(why: str) -> Setup[Any]:
    """The setup of a resource whose spec is invalid: it ends in Failed with reason InvalidSpec."""

    async def setup() -> Any:
        raise Refused("InvalidSpec", why)

    return setup


async def run_once(tx: Transaction[P], stopped: kopf.DaemonStopped, setup: Setup[P], work: Work[P]) -> None:
    """Run a transaction once (a final one is not run again), then settle its status."""
    done = tx.context.running.setdefault(tx.uid, asyncio.Event())
    done.clear()
    velero = restored_by_velero(tx.body)
    if velero is not None and not tx.final:  # a transaction re-created by a backup tool: never run again
        tx.fail(
            "RestoredByVelero",
            f"re-created by Velero restore {velero}: a {tx.kind} is a transaction, not state to restore, and it is "
            f"never run again; create a new {tx.kind} to run one",
        )
    left = tx.phase
    if left is not None and left not in FINAL and left != TransactionPhase.PENDING:
        # an earlier operator (a leader that died, or this process before a restart) left it mid-transaction
        message = (
            f"carrying on the {tx.kind} an earlier operator left in {left}: the same transaction id, so "
            f"what the servers already did is not done again (operator {tx.context.identity})"
        )
        log.info(f"{tx.kind} {tx.name}: {message}")
        tx.event("TakenOver", message)
    try:
        if not tx.final:
            await tx.run(stopped, setup, work)
        await tx.settle(stopped)
    finally:
        done.set()
