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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kopf

from gym_operator.discovery import DiscoveryError, participants_from_pods, selector_string
from gym_operator.kube import GROUP, VERSION, Kube
from gym_operator.specs import CheckpointSpec, OperatorSettings, RestoreSpec, SelectorSpec, SpecError, StorageSpec
from gym_operator.status import failed_status, now, pending_status, progress_status, result_status
from gym_services.base.config import StorageConfig
from gym_services.control.models import StorageAccess
from gym_services.control.storage import StorageError
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionPhase, TransactionResult

S = TypeVar("S", CheckpointSpec, RestoreSpec)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = 20  # INFO and up become Kubernetes Events
    settings.execution.max_workers = 4
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = "gym-checkpoint.dev/operator"
    try:
        memo.settings = OperatorSettings.from_env()
    except SpecError as exc:
        raise kopf.PermanentError(str(exc)) from None
    # Namespaced RBAC cannot watch namespaces or CRDs; the chart turns scanning off unless it adds a ClusterRole.
    settings.scanning.disabled = memo.settings.scanning_disabled
    memo.kube = Kube.connect()
    memo.locks = {}


def _selector(selector: SelectorSpec, operator: OperatorSettings) -> str:
    return selector_string(selector.match_labels, operator.release, operator.selector)


async def _discover(namespace: str, selector: SelectorSpec, memo: kopf.Memo):
    labels = _selector(selector, memo.settings)
    pods = await memo.kube.list_pods(namespace, labels)
    refs = participants_from_pods(pods)
    if not refs:
        raise DiscoveryError(f"no participant pods match {labels!r} in {namespace}")
    return refs


async def _storage_access(
    storage: StorageSpec, namespace: str, kube: Kube, operator: OperatorSettings
) -> tuple[StorageConfig, StorageAccess | None]:
    """How the operator reaches storage, and what the servers are told to use instead of their config.

    Endpoint and region come from the spec (else the operator's env), keys from ``credentialsSecret``
    (else the operator's). Whatever the spec names itself is also sent to every server with commit and
    restore, so the resource alone decides where records go; a spec naming none of them leaves each
    server on the release's storage settings.
    """
    keys: dict[str, str] = {}
    if storage.credentials_secret:
        data = await kube.secret_data(namespace, storage.credentials_secret)
        try:
            keys = {"access_key_id": data["AWS_ACCESS_KEY_ID"], "secret_access_key": data["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as exc:
            raise LookupError(f"Secret {storage.credentials_secret} has no {exc.args[0]}") from None
    named = {"endpoint_url": storage.endpoint, "region": storage.region, **keys}
    named = {k: v for k, v in named.items() if v}
    config = StorageConfig(
        endpoint_url=named.get("endpoint_url") or operator.endpoint_url,
        region=named.get("region") or operator.region,
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

    def __init__(
        self, kind: str, plural: str, name: str, namespace: str, selector: SelectorSpec, status, meta, memo: kopf.Memo, body
    ):
        self.kind, self.plural, self.name, self.namespace = kind, plural, name, namespace
        self.selector, self.status, self.memo, self.body = selector, status or {}, memo, body
        self.generation = meta.get("generation")
        self.fields: dict[str, Any] = {"startTime": self.status.get("startTime") or now()}

    async def patch(self, status: dict[str, Any]) -> None:
        await self.memo.kube.patch_status(self.plural, self.namespace, self.name, status)

    async def fail(self, reason: str, message: str) -> None:
        await self.patch(failed_status(reason, message, self.generation, **self.fields))
        kopf.warn(self.body, reason="Failed", message=message)

    async def sink(self, phase: TransactionPhase, detail: dict[str, Any]) -> None:
        """Coordinator progress -> status phase and an Event (reason: the phase)."""
        if phase.final:
            return  # the final status carries the outcome
        message = f"{phase.lower()}" + (f": {detail['error']}" if "error" in detail else "")
        await self.patch(progress_status(phase, message, self.generation, **self.fields))
        kopf.info(self.body, reason=phase.value, message=message)

    async def finish(self, result: TransactionResult) -> None:
        final = {**result_status(result, self.generation), "startTime": self.fields["startTime"]}
        await self.patch(final)
        if result.completed:
            kopf.info(self.body, reason="Completed", message=final["message"])
        else:
            kopf.warn(self.body, reason="Failed", message=final["message"])

    async def coordinator(self, storage: StorageSpec, client: ControlClient) -> Coordinator:
        """Participants from the stack's pods, storage settings from the spec; Refused otherwise."""
        try:
            participants = await _discover(self.namespace, self.selector, self.memo)
        except DiscoveryError as exc:
            raise Refused("NoParticipants", str(exc)) from None
        try:
            storage_config, access = await _storage_access(storage, self.namespace, self.memo.kube, self.memo.settings)
        except LookupError as exc:
            raise Refused("CredentialsNotFound", str(exc)) from None
        return Coordinator(
            participants, client, storage_config=storage_config, participant_storage=access, on_event=self.sink
        )

    async def run(self, work: Callable[[], Awaitable[TransactionResult]]) -> None:
        """Run ``work`` holding the stack's lock; a second transaction waits in Pending."""
        if self.status.get("phase") in (TransactionPhase.COMPLETED, TransactionPhase.FAILED):
            return  # already done (e.g. the handler state was lost on an operator restart)
        key = f"{self.namespace}/{_selector(self.selector, self.memo.settings)}"
        lock: asyncio.Lock = self.memo.locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            message = f"waiting: {getattr(lock, 'holder', 'another transaction')} is running on this stack"
            if self.status.get("phase") != TransactionPhase.PENDING or self.status.get("message") != message:
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


def _parse(model: type[S], spec: Any) -> tuple[S | None, str]:
    """The parsed spec, or None and why (the transaction then fails with reason InvalidSpec)."""
    try:
        return model.parse(spec), ""
    except SpecError as exc:
        return None, str(exc)


@kopf.on.create(GROUP, VERSION, "checkpoints")
async def checkpoint_created(spec, name, namespace, uid, status, meta, memo: kopf.Memo, body, **_: Any) -> None:
    parsed, invalid = _parse(CheckpointSpec, spec)
    selector = parsed.selector if parsed else SelectorSpec()
    tx = Transaction("Checkpoint", "checkpoints", name, namespace, selector, status, meta, memo, body)

    async def work() -> TransactionResult:
        if parsed is None:
            raise Refused("InvalidSpec", invalid)
        tx.fields["checkpointId"] = checkpoint_id = f"{name}-{uid[:8]}"
        location = parsed.storage.location or memo.settings.default_location
        if not location:
            raise Refused("NoStorage", "spec.storage.location is empty and the operator has no default")
        tx.fields["location"] = location
        async with ControlClient(memo.settings.token, timeout_s=memo.settings.checkpoint_call_timeout(parsed)) as client:
            coordinator = await tx.coordinator(parsed.storage, client)
            # the resource's uid names the transaction: an operator restarted mid-checkpoint repeats the same one, and
            # a Checkpoint re-created under a deleted one's name is another transaction, refused if its id is taken
            return await coordinator.checkpoint(
                checkpoint_id, location, prepare_timeout_s=parsed.prepare_timeout_seconds, lease_s=parsed.lease_seconds,
                transaction_id=uid, claimed_by=f"Checkpoint {namespace}/{name}", method=parsed.method,
            )

    await tx.run(work)


@kopf.on.create(GROUP, VERSION, "restores")
async def restore_created(spec, name, namespace, status, meta, uid, memo: kopf.Memo, body, **_: Any) -> None:
    parsed, invalid = _parse(RestoreSpec, spec)
    selector = parsed.selector if parsed else SelectorSpec()
    tx = Transaction("Restore", "restores", name, namespace, selector, status, meta, memo, body)

    async def work() -> TransactionResult:
        if parsed is None:
            raise Refused("InvalidSpec", invalid)
        checkpoint_id, location, storage = await _restore_source(parsed, namespace, memo)
        tx.fields.update(checkpointId=checkpoint_id, location=location)
        async with ControlClient(memo.settings.token, timeout_s=memo.settings.restore_call_timeout_s) as client:
            coordinator = await tx.coordinator(storage, client)
            # the resource's uid names the transaction: an operator restarted mid-restore repeats the same one
            return await coordinator.restore(checkpoint_id, location, lease_s=parsed.lease_seconds, restore_id=uid)

    await tx.run(work)


async def _restore_source(spec: RestoreSpec, namespace: str, memo: kopf.Memo) -> tuple[str, str, StorageSpec]:
    """Checkpoint id, location and storage settings a Restore names (directly or by Checkpoint)."""
    if spec.checkpoint_ref is None:
        location = spec.location or spec.storage.location or memo.settings.default_location
        if not spec.checkpoint_id or not location:
            raise Refused("InvalidSpec", "set checkpointRef.name, or checkpointId with location")
        return spec.checkpoint_id, location, spec.storage
    ref = spec.checkpoint_ref.name
    source = await memo.kube.get_object("checkpoints", namespace, ref)
    if source is None:
        raise Refused("CheckpointNotFound", f"Checkpoint {ref} does not exist in {namespace}")
    source_status = source.get("status") or {}
    if source_status.get("phase") == TransactionPhase.FAILED:
        raise Refused("CheckpointFailed", f"Checkpoint {ref} failed; nothing to restore")
    if source_status.get("phase") != TransactionPhase.COMPLETED:
        raise kopf.TemporaryError(f"Checkpoint {ref} is not completed yet", delay=2)
    try:
        checkpointed = CheckpointSpec.parse(source.get("spec"))
    except SpecError as exc:
        raise Refused("InvalidSpec", f"Checkpoint {ref}: {exc}") from None
    return source_status["checkpointId"], source_status["location"], spec.storage.over(checkpointed.storage)
