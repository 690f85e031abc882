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
from typing import Any

import kopf

from gym_operator.client import ControlClient
from gym_operator.coordinator import Coordinator
from gym_operator.discovery import DiscoveryError, participants_from_pods, selector_string
from gym_operator.kube import GROUP, VERSION, Kube
from gym_operator.status import TERMINAL, failed_status, now, pending_status, progress_status, result_status
from gym_services.base.config import StorageConfig
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


async def _storage_config(storage: dict[str, Any], namespace: str, memo: kopf.Memo) -> StorageConfig:
    """Endpoint and region from the spec (else the operator's env); keys from ``credentialsSecret``.

    The secret is used by the operator itself (manifest checks, publishing). Servers write
    their records with the release's S3 Secret, so both must reach the same bucket.
    """
    keys: dict[str, str] = {}
    if storage.get("credentialsSecret"):
        data = await memo.kube.secret_data(namespace, storage["credentialsSecret"])
        try:
            keys = {"access_key_id": data["AWS_ACCESS_KEY_ID"], "secret_access_key": data["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as exc:
            raise LookupError(f"Secret {storage['credentialsSecret']} has no {exc.args[0]}") from None
    return StorageConfig(
        endpoint_url=storage.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL"),
        region=storage.get("region") or os.environ.get("AWS_REGION"),
        **keys,
    )


async def _run_exclusive(kind: str, plural: str, name: str, namespace: str, spec, status, meta, memo, body, work):
    """Run ``work`` holding the stack's lock; a second transaction waits in Pending."""
    generation = meta.get("generation")
    if (status or {}).get("phase") in TERMINAL:
        return  # already done (e.g. the handler state was lost on an operator restart)
    key = _stack_key(namespace, spec, memo)
    lock: asyncio.Lock = memo.locks.setdefault(key, asyncio.Lock())
    if lock.locked():
        holder = getattr(lock, "holder", "another transaction")
        message = f"waiting: {holder} is running on this stack"
        if (status or {}).get("phase") != "Pending" or (status or {}).get("message") != message:
            await memo.kube.patch_status(plural, namespace, name, pending_status("WaitingForStack", message, generation))
            kopf.info(body, reason="Waiting", message=message)
        raise kopf.TemporaryError(message, delay=1)
    async with lock:
        lock.holder = f"{kind} {name}"  # type: ignore[attr-defined]
        await work(generation)


async def _progress_sink(plural: str, name: str, namespace: str, body, memo, generation, extra: dict[str, Any]):
    async def sink(phase: str, detail: dict[str, Any]) -> None:
        if phase in ("Completed", "Failed"):
            return  # the final status carries the outcome
        message = f"{phase.lower()}" + (f": {detail['error']}" if "error" in detail else "")
        await memo.kube.patch_status(plural, namespace, name, progress_status(phase, message, generation, **extra))
        kopf.info(body, reason=PHASE_REASONS.get(phase, phase), message=message)

    return sink


@kopf.on.create(GROUP, VERSION, "checkpoints")
async def checkpoint_created(spec, name, namespace, uid, status, meta, memo: kopf.Memo, body, **_: Any) -> None:
    checkpoint_id = f"{name}-{uid[:8]}"
    storage = spec.get("storage") or {}
    location = storage.get("location") or memo.default_location

    async def work(generation: int | None) -> None:
        started = {"startTime": (status or {}).get("startTime") or now(), "checkpointId": checkpoint_id}
        if not location:
            await memo.kube.patch_status(
                "checkpoints", namespace, name,
                failed_status("NoStorage", "spec.storage.location is empty and the operator has no default", generation, **started),
            )
            kopf.warn(body, reason="Failed", message="no storage location")
            return
        started["location"] = location
        try:
            participants = await _discover(namespace, spec, memo)
        except DiscoveryError as exc:
            await memo.kube.patch_status("checkpoints", namespace, name, failed_status("NoParticipants", str(exc), generation, **started))
            kopf.warn(body, reason="Failed", message=str(exc))
            return
        try:
            storage_config = await _storage_config(storage, namespace, memo)
        except LookupError as exc:
            await memo.kube.patch_status("checkpoints", namespace, name, failed_status("CredentialsNotFound", str(exc), generation, **started))
            kopf.warn(body, reason="Failed", message=str(exc))
            return
        sink = await _progress_sink("checkpoints", name, namespace, body, memo, generation, started)
        async with ControlClient(memo.token, timeout_s=float(spec.get("prepareTimeoutSeconds", 30)) + 30) as client:
            coordinator = Coordinator(participants, client, storage_config=storage_config, on_event=sink)
            try:
                result = await coordinator.checkpoint(
                    checkpoint_id,
                    location,
                    prepare_timeout_s=float(spec.get("prepareTimeoutSeconds", 30)),
                    lease_s=float(spec.get("leaseSeconds", 30)),
                )
            except StorageError as exc:
                await memo.kube.patch_status("checkpoints", namespace, name, failed_status("StorageError", str(exc), generation, **started))
                kopf.warn(body, reason="Failed", message=str(exc))
                return
        final = {**result_status(result, generation), "startTime": started["startTime"]}
        await memo.kube.patch_status("checkpoints", namespace, name, final)
        if result.status == "completed":
            kopf.info(body, reason="Completed", message=final["message"])
        else:
            kopf.warn(body, reason="Failed", message=final["message"])

    await _run_exclusive("Checkpoint", "checkpoints", name, namespace, spec, status, meta, memo, body, work)


@kopf.on.create(GROUP, VERSION, "restores")
async def restore_created(spec, name, namespace, status, meta, memo: kopf.Memo, body, **_: Any) -> None:
    async def work(generation: int | None) -> None:
        started: dict[str, Any] = {"startTime": (status or {}).get("startTime") or now()}
        ref = spec.get("checkpointRef") or {}
        storage = spec.get("storage") or {}
        if ref.get("name"):
            source = await memo.kube.get_object("checkpoints", namespace, ref["name"])
            if source is None:
                await memo.kube.patch_status("restores", namespace, name, failed_status(
                    "CheckpointNotFound", f"Checkpoint {ref['name']} does not exist in {namespace}", generation, **started))
                kopf.warn(body, reason="Failed", message=f"Checkpoint {ref['name']} not found")
                return
            source_status = source.get("status") or {}
            if source_status.get("phase") != "Completed":
                if source_status.get("phase") == "Failed":
                    await memo.kube.patch_status("restores", namespace, name, failed_status(
                        "CheckpointFailed", f"Checkpoint {ref['name']} failed; nothing to restore", generation, **started))
                    return
                raise kopf.TemporaryError(f"Checkpoint {ref['name']} is not completed yet", delay=2)
            checkpoint_id, location = source_status["checkpointId"], source_status["location"]
            storage = {**(source.get("spec", {}).get("storage") or {}), **storage}
        else:
            checkpoint_id, location = spec.get("checkpointId"), storage.get("location") or memo.default_location
            if not checkpoint_id or not location:
                await memo.kube.patch_status("restores", namespace, name, failed_status(
                    "InvalidSpec", "set checkpointRef.name, or checkpointId with storage.location", generation, **started))
                return
        started.update(checkpointId=checkpoint_id, location=location)
        try:
            participants = await _discover(namespace, spec, memo)
        except DiscoveryError as exc:
            await memo.kube.patch_status("restores", namespace, name, failed_status("NoParticipants", str(exc), generation, **started))
            kopf.warn(body, reason="Failed", message=str(exc))
            return
        try:
            storage_config = await _storage_config(storage, namespace, memo)
        except LookupError as exc:
            await memo.kube.patch_status("restores", namespace, name, failed_status("CredentialsNotFound", str(exc), generation, **started))
            kopf.warn(body, reason="Failed", message=str(exc))
            return
        sink = await _progress_sink("restores", name, namespace, body, memo, generation, started)
        async with ControlClient(memo.token, timeout_s=120) as client:
            coordinator = Coordinator(participants, client, storage_config=storage_config, on_event=sink)
            result = await coordinator.restore(checkpoint_id, location, lease_s=float(spec.get("leaseSeconds", 30)))
        final = {**result_status(result, generation), "startTime": started["startTime"]}
        await memo.kube.patch_status("restores", namespace, name, final)
        if result.status == "completed":
            kopf.info(body, reason="Completed", message=final["message"])
        else:
            kopf.warn(body, reason="Failed", message=final["message"])

    await _run_exclusive("Restore", "restores", name, namespace, spec, status, meta, memo, body, work)
