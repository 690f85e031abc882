"""The release going away: the operator lets go of its finalizers while it still may.

Only a resource whose deletion needs the operator holds its finalizer (:mod:`gym_operator.handlers`), so most of
a release's Checkpoints and Restores hold none. Those that do - a transaction that has not ended, a Checkpoint with
``deletionPolicy: Delete`` and stored objects - must not keep their finalizer once nothing will ever run the
operator again, or deleting them, their CRDs and their namespace waits for ever. Nothing can remove a finalizer
after the operator's rights are gone, and Helm deletes the operator's Deployment, RoleBinding, Role and
ServiceAccount in one pass, before the kubelet sends its pod SIGTERM; a namespace's deletion removes them in no set
order. So:

- ``helm uninstall``: the chart's pre-delete hook (:mod:`gym_operator.uninstall`) marks the release's Kubernetes
  Lease before Helm deletes anything. The leader steps down (:mod:`gym_operator.main`): kopf stops, and this cleanup
  (:func:`release_all`, kopf's ``on.cleanup``) takes the finalizers off under the operator's own Role. The hook then
  takes off whatever is left, if no operator ran.
- the operator stopping while its Deployment is gone or being deleted (``operator.enabled=false``, a Deployment
  deleted by hand) or its namespace terminating: the same cleanup, if its rights are still there. When the API
  refuses (401, 403: the rights went first) it says so in an error with the command that finishes the job; nothing
  is silently skipped.
- an operator stopping for an upgrade, a restart or an eviction keeps them: the next one handles the deletions.

A Checkpoint with ``deletionPolicy: Delete`` keeps its stored objects then (one ``DataKept`` Warning says so). The
daemons have stopped by now: the servers' pause leases end any transaction that was running. The order this relies
on is in ``docs/operations/guide.md`` ("Uninstall").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gym_operator.controllers.context import LEGACY_FINALIZER, Context, finalizer_of
from gym_operator.kube import Kube, KubeError, Unavailable

log = logging.getLogger("gym.operator")

#: tries to take the finalizer off one resource (each a read and a conditional patch)
RELEASE_ATTEMPTS = 5
#: what finishes the job by hand when the operator could not (one resource)
BY_HAND = 'kubectl patch {kind} {name} -n {namespace} --type=merge -p \'{{"metadata":{{"finalizers":null}}}}\''


def by_hand(context: Context, namespace: str) -> str:
    """The commands that take the finalizers off what the watch last showed holding this operator's in
    ``namespace``."""
    held = sorted((plural, name) for plural, ns, name in context.held.values() if ns == namespace)
    if not held:
        return f"(none of the release's resources in {namespace} held it when last seen)"
    return "; ".join(BY_HAND.format(kind=plural[:-1], name=name, namespace=namespace) for plural, name in held)


async def release_all(context: Context) -> None:
    """Where the operator may have put finalizers (where it saw its resources): let them go if the release is going
    away."""
    for namespace in sorted(context.namespaces):
        try:
            why = await going_away(context, namespace)
        except KubeError as exc:
            log.error(
                f"cannot tell whether release {context.settings.release} is going away from {namespace} ({exc}); "
                "its finalizers stay. If the release was uninstalled without its pre-delete hook (helm uninstall "
                f"--no-hooks) or its namespace is being deleted, remove them: {by_hand(context, namespace)}"
            )
            continue
        if why is None:
            continue
        try:
            await release_resources(context.kube, context.settings.release, namespace, why)
        except KubeError as exc:
            log.error(f"{why}, but {exc}; the finalizers stay: {by_hand(context, namespace)}")


async def going_away(context: Context, namespace: str) -> str | None:
    """Why the release is going away from ``namespace`` (None: it is not). Raises :class:`KubeError` when the API
    does not say (no answer, or the operator's rights are gone)."""
    leadership = context.leadership
    if leadership is not None and leadership.uninstalling:
        return (
            f"the release is being uninstalled (its Kubernetes Lease marked for Deployment {leadership.uninstalling})"
        )
    kube, settings = context.kube, context.settings
    if await kube.deletion_started("namespace", namespace, namespace):
        return f"namespace {namespace} is being deleted"
    if settings.deployment and await kube.deletion_started("deployment", namespace, settings.deployment):
        return f"Deployment {settings.deployment} is gone (the release was uninstalled)"
    return None


async def release_resources(kube: Kube, release: str, namespace: str, why: str) -> list[str]:
    """Take the release's finalizers off every Checkpoint and Restore of ``release`` in ``namespace``; the ones
    released. A Checkpoint that keeps stored objects it would have deleted says so in a ``DataKept`` Warning. Raises
    :class:`KubeError` (after trying both kinds) when one could not be listed."""
    released, failed = [], []
    mine = finalizer_of(release)
    for plural in ("checkpoints", "restores"):
        try:
            found = await kube.list_objects(plural, namespace)
        except KubeError as exc:
            failed.append(exc)
            continue
        for obj in found:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            held = {mine, LEGACY_FINALIZER} & set(meta.get("finalizers") or [])
            if spec.get("release") != release or not held:
                continue
            if plural == "checkpoints" and mine in held:
                await _data_kept(kube, obj, why)
            if await _remove_finalizers(kube, plural, obj, held):
                released.append(f"{plural}/{meta['name']}")
    log.info(f"{why}: released the finalizers of {', '.join(released) or 'nothing'}")
    if failed:
        raise failed[0]
    return released


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
        await kube.event(checkpoint, "DataKept", message, warning=True)
    except KubeError as exc:  # (a terminating namespace takes no new Events)
        log.warning(f"could not post the DataKept Event: {exc}")


async def drop_legacy_finalizer(context: Context, plural: str, body: Any) -> None:
    """A resource of the release still holding the finalizer all releases once shared (put by an older operator):
    taken off, once (the operator's own goes on instead where it is needed). A conflict or no answer leaves it for the
    next watch event of the resource."""
    if LEGACY_FINALIZER not in ((body.get("metadata") or {}).get("finalizers") or []):
        return
    try:
        await context.kube.remove_finalizers(plural, dict(body), {LEGACY_FINALIZER})
    except KubeError as exc:
        log.info(f"{plural}/{body['metadata'].get('name')}: the old shared finalizer stays for now ({exc})")


async def _remove_finalizers(kube: Kube, plural: str, listed: dict[str, Any], finalizers: set[str]) -> bool:
    """Take ``finalizers`` off one resource as listed; on a conflict (it changed since) or no answer, list it again
    (list and patch: what the chart's Role grants on Checkpoints and Restores alike)."""
    meta = listed.get("metadata") or {}
    found: dict[str, Any] | None = listed
    for _attempt in range(RELEASE_ATTEMPTS):
        try:
            if found is None:
                found = next((o for o in await kube.list_objects(plural, meta["namespace"]) if _same(o, meta)), None)
                if found is None:
                    return False  # gone meanwhile
            return await kube.remove_finalizers(plural, found, finalizers)
        except Unavailable as exc:
            log.warning(f"releasing {plural}/{meta.get('name')}: {exc}; retrying")
            found = None
            await asyncio.sleep(0.5)
        except KubeError as exc:  # refused (401, 403): retrying cannot help
            log.error(f"releasing {plural}/{meta.get('name')} was refused ({exc}); its finalizer stays")
            return False
    return False


def _same(obj: dict[str, Any], meta: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("uid") == meta.get("uid"))
