"""kopf handlers: a new Checkpoint or Restore runs the coordinator against the stack's pods.

Run with ``kopf run --standalone --namespace NS -m gym_operator.handlers``. Environment:
``GYMCKPT_CONTROL_TOKEN`` (the Secret shared with the servers), ``GYMCKPT_STORAGE`` (default
location), ``GYMCKPT_RELEASE`` (default selector ``app.kubernetes.io/instance=<release>``),
``AWS_*`` for S3.

One Checkpoint or Restore runs at a time per stack; a later one waits in ``Pending``. If the
operator restarts mid-transaction, kopf runs the handler again and the coordinator, which is
idempotent per checkpoint id, finishes or aborts it; the servers' leases guarantee the stack
is never left paused meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_operator.discovery import DiscoveryError, participants_from_pods, selector_string
from gym_operator.kube import GROUP, VERSION, Kube
from gym_operator.status import TERMINAL, failed_status, now, pending_status, progress_status, result_status
from gym_services.base.config import StorageConfig
from gym_services.control.models import StorageAccess
from gym_services.control.storage import StorageError

PHASE_REASONS = {
    "Preparing": "Preparing",
    "Committing": "Committing",
    "Publishing": "Publishing",
    "Resuming": "Resuming",
    "Restoring": "Restoring",
    "Aborting": "Aborting",
}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = 20  # INFO and up become Kubernetes Events
    settings.execution.max_workers = 4
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = "gym-checkpoint.dev/operator"
    # Namespaced RBAC cannot watch namespaces or CRDs; the chart turns scanning off unless it adds a ClusterRole.
    settings.scanning.disabled = os.environ.get("GYMCKPT_KOPF_SCANNING", "") == "disabled"
    memo.kube = Kube.connect()
    memo.token = os.environ.get("GYMCKPT_CONTROL_TOKEN", "")
    memo.default_location = os.environ.get("GYMCKPT_STORAGE")
    memo.release = os.environ.get("GYMCKPT_RELEASE")
    memo.selector = os.environ.get("GYMCKPT_PARTICIPANT_SELECTOR")
    memo.locks = {}
    if not memo.token:
        raise kopf.PermanentError("GYMCKPT_CONTROL_TOKEN is not set: the operator cannot call control routes")


def _stack_key(namespace: str, spec: dict[str, Any], memo: kopf.Memo) -> str:
    match = (spec.get("selector") or {}).get("matchLabels")
    return f"{namespace}/{selector_string(match, memo.release, memo.selector)}"


async def _discover(namespace: str, spec: dict[str, Any], memo: kopf.Memo):
    selector = selector_string((spec.get("selector") or {}).get("matchLabels"), memo.release, memo.selector)
    pods = await memo.kube.list_pods(namespace, selector)
    refs = participants_from_pods(pods)
    if not refs:
        raise DiscoveryError(f"no participant pods match {selector!r} in {namespace}")
    return refs


async def _storage_access(
    storage: dict[str, Any], namespace: str, memo: kopf.Memo
) -> tuple[StorageConfig, StorageAccess | None]:
    """How the operator reaches storage, and what the servers are told to use instead of their config.

    Endpoint and region come from the spec (else the operator's env), keys from ``credentialsSecret``
    (else the operator's). Whatever the spec names itself is also sent to every server with commit and
    restore, so the resource alone decides where records go; a spec naming none of them leaves each
    server on the release's storage settings.
    """
    keys: dict[str, str] = {}
    if storage.get("credentialsSecret"):
        data = await memo.kube.secret_data(namespace, storage["credentialsSecret"])
        try:
            keys = {"access_key_id": data["AWS_ACCESS_KEY_ID"], "secret_access_key": data["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as exc:
            raise LookupError(f"Secret {storage['credentialsSecret']} has no {exc.args[0]}") from None
    named = {"endpoint_url": storage.get("endpoint"), "region": storage.get("region"), **keys}
    named = {k: v for k, v in named.items() if v}
    config = StorageConfig(
        endpoint_url=named.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL"),
        region=named.get("region") or os.environ.get("AWS_REGION"),
        **keys,
    )
    return config, (StorageAccess(**named) if named else None)


class Refused(Exception):
    """The transaction cannot start; ends the resource in Failed with this reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Transaction:
    """One Checkpoint or Restore resource: its status writes, events and the stack lock."""

    def __init__(self, kind: str, plural: str, name: str, namespace: str, spec, status, meta, memo: kopf.Memo, body):
        self.kind, self.plural, self.name, self.namespace = kind, plural, name, namespace
        self.spec, self.status, self.memo, self.body = spec, status or {}, memo, body
        self.generation = meta.get("generation")
        self.fields: dict[str, Any] = {"startTime": self.status.get("startTime") or now()}

    async def patch(self, status: dict[str, Any]) -> None:
        await self.memo.kube.patch_status(self.plural, self.namespace, self.name, status)

    async def fail(self, reason: str, message: str) -> None:
        await self.patch(failed_status(reason, message, self.generation, **self.fields))
        kopf.warn(self.body, reason="Failed", message=message)

    async def sink(self, phase: str, detail: dict[str, Any]) -> None:
        """Coordinator progress -> status phase and an Event."""
        if phase in ("Completed", "Failed"):
            return  # the final status carries the outcome
        message = f"{phase.lower()}" + (f": {detail['error']}" if "error" in detail else "")
        await self.patch(progress_status(phase, message, self.generation, **self.fields))
        kopf.info(self.body, reason=PHASE_REASONS.get(phase, phase), message=message)

    async def finish(self, result: TransactionResult) -> None:
        final = {**result_status(result, self.generation), "startTime": self.fields["startTime"]}
        await self.patch(final)
        if result.status == "completed":
            kopf.info(self.body, reason="Completed", message=final["message"])
        else:
            kopf.warn(self.body, reason="Failed", message=final["message"])

    async def coordinator(self, storage: dict[str, Any], client: ControlClient) -> Coordinator:
        """Participants from the stack's pods, storage settings from the spec; Refused otherwise."""
        try:
            participants = await _discover(self.namespace, self.spec, self.memo)
        except DiscoveryError as exc:
            raise Refused("NoParticipants", str(exc)) from None
        try:
            storage_config, access = await _storage_access(storage, self.namespace, self.memo)
        except LookupError as exc:
            raise Refused("CredentialsNotFound", str(exc)) from None
        return Coordinator(
            participants, client, storage_config=storage_config, participant_storage=access, on_event=self.sink
        )

    async def run(self, work: Callable[[], Awaitable[TransactionResult]]) -> None:
        """Run ``work`` holding the stack's lock; a second transaction waits in Pending."""
        if self.status.get("phase") in TERMINAL:
            return  # already done (e.g. the handler state was lost on an operator restart)
        key = _stack_key(self.namespace, self.spec, self.memo)
        lock: asyncio.Lock = self.memo.locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            message = f"waiting: {getattr(lock, 'holder', 'another transaction')} is running on this stack"
            if self.status.get("phase") != "Pending" or self.status.get("message") != message:
                await self.patch(pending_status("WaitingForStack", message, self.generation))
                kopf.info(self.body, reason="Waiting", message=message)
            raise kopf.TemporaryError(message, delay=1)
        async with lock:
            lock.holder = f"{self.kind} {self.name}"  # type: ignore[attr-defined]
            try:
                await self.finish(await work())
            except Refused as exc:
                await self.fail(exc.reason, exc.message)
            except StorageError as exc:
                await self.fail("StorageError", str(exc))


@kopf.on.create(GROUP, VERSION, "checkpoints")
async def checkpoint_created(spec, name, namespace, uid, status, meta, memo: kopf.Memo, body, **_: Any) -> None:
    tx = Transaction("Checkpoint", "checkpoints", name, namespace, spec, status, meta, memo, body)
    storage = spec.get("storage") or {}
    timeout = float(spec.get("prepareTimeoutSeconds", 30))

    async def work() -> TransactionResult:
        tx.fields["checkpointId"] = checkpoint_id = f"{name}-{uid[:8]}"
        location = storage.get("location") or memo.default_location
        if not location:
            raise Refused("NoStorage", "spec.storage.location is empty and the operator has no default")
        tx.fields["location"] = location
        async with ControlClient(memo.token, timeout_s=timeout + 30) as client:
            coordinator = await tx.coordinator(storage, client)
            return await coordinator.checkpoint(
                checkpoint_id, location, prepare_timeout_s=timeout, lease_s=float(spec.get("leaseSeconds", 30))
            )

    await tx.run(work)


@kopf.on.create(GROUP, VERSION, "restores")
async def restore_created(spec, name, namespace, status, meta, uid, memo: kopf.Memo, body, **_: Any) -> None:
    tx = Transaction("Restore", "restores", name, namespace, spec, status, meta, memo, body)

    async def work() -> TransactionResult:
        checkpoint_id, location, storage = await _restore_source(spec, namespace, memo)
        tx.fields.update(checkpointId=checkpoint_id, location=location)
        async with ControlClient(memo.token, timeout_s=120) as client:
            coordinator = await tx.coordinator(storage, client)
            # the resource's uid names the transaction: an operator restarted mid-restore repeats the same one
            return await coordinator.restore(
                checkpoint_id, location, lease_s=float(spec.get("leaseSeconds", 30)), restore_id=uid
            )

    await tx.run(work)


async def _restore_source(spec, namespace: str, memo: kopf.Memo) -> tuple[str, str, dict[str, Any]]:
    """Checkpoint id, location and storage settings a Restore names (directly or by Checkpoint)."""
    ref = spec.get("checkpointRef") or {}
    storage = spec.get("storage") or {}
    if not ref.get("name"):
        checkpoint_id, location = spec.get("checkpointId"), storage.get("location") or memo.default_location
        if not checkpoint_id or not location:
            raise Refused("InvalidSpec", "set checkpointRef.name, or checkpointId with storage.location")
        return checkpoint_id, location, storage
    source = await memo.kube.get_object("checkpoints", namespace, ref["name"])
    if source is None:
        raise Refused("CheckpointNotFound", f"Checkpoint {ref['name']} does not exist in {namespace}")
    source_status = source.get("status") or {}
    if source_status.get("phase") == "Failed":
        raise Refused("CheckpointFailed", f"Checkpoint {ref['name']} failed; nothing to restore")
    if source_status.get("phase") != "Completed":
        raise kopf.TemporaryError(f"Checkpoint {ref['name']} is not completed yet", delay=2)
    merged = {**(source.get("spec", {}).get("storage") or {}), **storage}
    return source_status["checkpointId"], source_status["location"], merged
