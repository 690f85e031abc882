"""The release's uninstall, run by the chart's pre-delete hook (``gym-operator --namespace NS --uninstall``) while the
operator's Role, RoleBinding and ServiceAccount still exist.

Helm deletes the operator's Deployment, RoleBinding, Role and ServiceAccount in one pass, and only then does the
kubelet stop the operator's pod: an operator that let go of its finalizers only as it stopped would find its token
refused (401) or its Role gone (403), and what held its finalizer would keep it - and with it its CRD's and its
namespace's deletion - for ever. So the hook, before Helm deletes anything:

1. marks the release's Kubernetes Lease (:data:`~gym_operator.leadership.UNINSTALLING`, naming the uid of the
   operator Deployment being uninstalled; created marked if no operator ever made it): no replica takes a marked
   Lease, and its holder steps down - it stops its handlers (a transaction
   in flight is left to the servers' pause leases), takes the release's finalizers off under its own Role, and
   releases the Lease (:mod:`gym_operator.main`);
2. waits until no operator holds the Lease: released, or unrenewed for its duration (its holder is gone), at most
   ``--timeout`` seconds;
3. takes the release's finalizers off whatever still carries one (no operator ran, or it could not): nothing of the
   release waits for an operator that will never run again.

A Checkpoint with ``deletionPolicy: Delete`` keeps its stored objects (one ``DataKept`` Warning says so). Exit 0 once
done, also when the operator did not step down in time (said in a warning: its finalizers are taken off all the
same); 1 when the Kubernetes API refused or did not answer (Helm then stops the uninstall before deleting anything:
run it again). The hook's own Role grants exactly these calls (``charts/gym-checkpoint/templates/uninstall-hook.yaml``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gym_operator.controllers.release import release_resources
from gym_operator.kube import Kube, KubeError, api_client
from gym_operator.leadership import UNINSTALLING, LeadershipSettings

log = logging.getLogger("gym.operator.uninstall")

#: how often the hook reads the Lease while it waits
POLL_S = 1.0


def instance(api: client.ApiClient, namespace: str, deployment: str | None) -> str:
    """What the mark names: the uid of the operator Deployment being uninstalled (``none`` when it is gone: then no
    operator of this install runs, and a later install's has another uid)."""
    if not deployment:
        return "none"
    try:
        found = client.AppsV1Api(api).read_namespaced_deployment(deployment, namespace, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            return "none"
        raise
    return str(found.metadata.uid) if found.metadata and found.metadata.uid else "none"


def mark(api: client.CoordinationV1Api, settings: LeadershipSettings, value: str) -> str:
    """Mark the release's Kubernetes Lease with ``value`` (create it marked if it is missing); the mark."""
    s = settings
    for _attempt in range(5):
        try:
            record = api.read_namespaced_lease(s.name, s.namespace, _request_timeout=10)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=s.name, namespace=s.namespace, annotations={UNINSTALLING: value}),
                spec=client.V1LeaseSpec(lease_duration_seconds=math.ceil(s.duration_s), lease_transitions=0),
            )
            try:
                created = api.create_namespaced_lease(s.namespace, body, _request_timeout=10)
            except ApiException as exc2:
                if exc2.status == 409:  # an operator created it meanwhile: mark that one
                    continue
                raise
            return str(((created.metadata.annotations if created.metadata else None) or {}).get(UNINSTALLING))
        if ((record.metadata.annotations if record.metadata else None) or {}).get(UNINSTALLING) != value:
            patch = {"metadata": {"annotations": {UNINSTALLING: value}}}
            api.patch_namespaced_lease(s.name, s.namespace, patch, _request_timeout=10)
        return value
    raise RuntimeError(f"Lease {s.namespace}/{s.name} kept changing underneath: run it again")


def wait_stepped_down(api: client.CoordinationV1Api, settings: LeadershipSettings, timeout_s: float) -> str | None:
    """Wait until no operator holds the Lease (released, or unrenewed for its duration as seen here); how it ended,
    or None when ``timeout_s`` passed first."""
    s = settings
    deadline = time.monotonic() + timeout_s
    version, since = None, time.monotonic()
    while time.monotonic() < deadline:
        record = api.read_namespaced_lease(s.name, s.namespace, _request_timeout=10)
        spec = record.spec or client.V1LeaseSpec()
        if not spec.holder_identity:
            return "no operator holds the Lease"
        seen = record.metadata.resource_version if record.metadata else None
        if seen != version:
            version, since = seen, time.monotonic()
        held_for = spec.lease_duration_seconds or math.ceil(s.duration_s)
        if time.monotonic() - since > held_for:
            return f"{spec.holder_identity} stopped renewing the Lease {held_for}s ago"
        time.sleep(POLL_S)
    return None


async def run(settings: LeadershipSettings, release: str, deployment: str | None, timeout_s: float) -> int:
    """The hook: mark, wait, release; the exit status."""
    api = api_client()
    coordination = client.CoordinationV1Api(api)
    s = settings
    try:
        value = await asyncio.to_thread(instance, api, s.namespace, deployment)
        await asyncio.to_thread(mark, coordination, s, value)
        log.info(
            f"marked Lease {s.namespace}/{s.name}: release {release} is being uninstalled (operator Deployment {value})"
        )
        ended = await asyncio.to_thread(wait_stepped_down, coordination, s, timeout_s)
        if ended is None:
            log.warning(
                f"the operator of release {release} did not step down within {timeout_s:g}s; taking the release's "
                "finalizers off all the same"
            )
        else:
            log.info(f"the operator stepped down: {ended}")
        why = f"release {release} is being uninstalled"
        released: list[Any] = await release_resources(Kube(api), release, s.namespace, why)
    except (ApiException, KubeError, OSError, RuntimeError) as exc:
        log.error(f"the uninstall of release {release} could not let go of its resources: {exc}")
        return 1
    finally:
        await asyncio.to_thread(api.close)
    print(f"release {release}: no operator acts any more; finalizers taken off here: {', '.join(released) or 'none'}")
    return 0
