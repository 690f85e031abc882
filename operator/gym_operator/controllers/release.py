"""The release going away: the operator lets go of its finalizers as it stops for good.

When the operator stops and its release is going away - its Deployment is gone or being deleted (``helm
uninstall``), or its namespace is terminating - nothing will ever run its handlers again: it takes its finalizer off
every Checkpoint and Restore of the release, so deleting them, their CRDs or the namespace completes. An operator
that stops for an upgrade, a restart or an eviction keeps them: the next one handles the deletions. A Checkpoint
with ``deletionPolicy: Delete`` keeps its stored objects then (one ``DataKept`` Warning says so). Its daemons have
stopped by now: the servers' pause leases end any transaction that was running. The order this relies on is in
``docs/operations/guide.md`` ("Uninstall").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gym_operator.controllers.context import FINALIZER, Context
from gym_operator.kube import Kube, KubeError
from gym_operator.specs import OperatorSettings

log = logging.getLogger("gym.operator")

#: tries to take the finalizer off one resource (each a read and a conditional patch)
RELEASE_ATTEMPTS = 5


async def release_all(context: Context) -> None:
    """Where the operator may have put finalizers (where its resources are): let them go if the release is going
    away."""
    for namespace in sorted(context.namespaces):
        await release_namespace(context.kube, context.settings, namespace)


async def going_away(kube: Kube, settings: OperatorSettings, namespace: str) -> str | None:
    """Why the release is going away from ``namespace`` (None: it is not, or the API does not say)."""
    if await kube.deletion_started("namespace", namespace, namespace):
        return f"namespace {namespace} is being deleted"
    if settings.deployment and await kube.deletion_started("deployment", namespace, settings.deployment):
        return f"Deployment {settings.deployment} is gone (the release was uninstalled)"
    return None


async def release_namespace(kube: Kube, settings: OperatorSettings, namespace: str) -> None:
    why = await going_away(kube, settings, namespace)
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
            if plural == "checkpoints":
                await _data_kept(kube, obj, why)
            if await _remove_finalizer(kube, plural, obj):
                released.append(f"{plural}/{meta['name']}")
    log.info(f"{why}: released the finalizers of {', '.join(released) or 'nothing'}")


async def _data_kept(kube: Kube, checkpoint: dict[str, Any], why: str) -> None:
    """A Checkpoint with ``deletionPolicy: Delete`` and stored data keeps them: one Warning says so."""
    spec, status = checkpoint.get("spec") or {}, checkpoint.get("status") or {}
    if spec.get("deletionPolicy") != "Delete" or not status.get("checkpointId"):
        return
    message = (
        f"{why}: the operator stops for good and lets the Checkpoint go without deleting checkpoint "
        f"{status['checkpointId']} at {status.get('location')} (`gymckpt checkpoints delete "
        f"{status['checkpointId']} --storage {status.get('location')}` removes it)"
    )
    log.warning(message)
    try:
        await kube.warn(checkpoint, "DataKept", message)
    except KubeError as exc:  # (a terminating namespace takes no new Events)
        log.warning(f"could not post the DataKept Event: {exc}")


async def _remove_finalizer(kube: Kube, plural: str, listed: dict[str, Any]) -> bool:
    """Take the finalizer off one resource as listed; on a conflict (it changed since) or no answer, list it again
    (list and patch: what the chart's Role grants on Checkpoints and Restores alike)."""
    meta = listed.get("metadata") or {}
    found: dict[str, Any] | None = listed
    for _attempt in range(RELEASE_ATTEMPTS):
        try:
            if found is None:
                found = next((o for o in await kube.list_objects(plural, meta["namespace"]) if _same(o, meta)), None)
                if found is None:
                    return False  # gone meanwhile
            return await kube.remove_finalizer(plural, found, FINALIZER)
        except KubeError as exc:
            log.warning(f"releasing {plural}/{meta.get('name')}: {exc}; retrying")
            found = None
            await asyncio.sleep(0.5)
    return False


def _same(obj: dict[str, Any], meta: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("uid") == meta.get("uid"))
