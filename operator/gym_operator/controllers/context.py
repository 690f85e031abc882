"""What every controller shares: the operator's settings and clients, the stack's discovery, storage access, Events.

One :class:`Context` per operator process, built by kopf's startup handler (:func:`gym_operator.handlers.startup`)
and kept in kopf's memo; each controller gets it from there. Nothing here knows a lifecycle.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import kopf

from gym_operator.discovery import (
    DiscoveryError,
    StackRolling,
    check_replica_counts,
    participants_from_pods,
    replicated_statefulsets,
    rollout_problems,
    selector_matches,
    selector_string,
    template_labels,
)
from gym_operator.kube import Kube
from gym_operator.specs import OperatorSettings, SelectorSpec, StorageLocation, UnknownLocation
from gym_services.base.config import StorageConfig
from gym_services.control.models import StorageAccess
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.coordinator import TransactionPhase

#: the finalizer kopf puts on every Checkpoint and Restore of this operator's release
FINALIZER = "gym-checkpoint.dev/operator"
#: the phases a transaction ends in
FINAL = (TransactionPhase.COMPLETED, TransactionPhase.FAILED)


class StackLock(asyncio.Lock):
    """One transaction at a time on a stack; ``holder`` names the one that runs (for those waiting), ``finals`` the
    final (termination) checkpoints waiting for it, which go first."""

    def __init__(self) -> None:
        super().__init__()
        self.holder = "another transaction"
        self.finals: set[str] = set()


@dataclass
class Context:
    """The operator's settings and Kubernetes client, and what its controllers keep between calls."""

    settings: OperatorSettings
    kube: Kube
    #: this operator replica (its leadership identity), named in the Events of a transaction it carries on
    identity: str = "restarted"
    #: one lock per stack (namespace and selector): one transaction at a time on it
    locks: dict[str, StackLock] = field(default_factory=dict)
    #: resource uid -> an Event set once its transaction has ended (a deletion waits for it)
    running: dict[str, asyncio.Event] = field(default_factory=dict)
    #: (resource uid, reason) -> the message of the last Event posted with it
    posted: dict[tuple[str | None, str], str] = field(default_factory=dict)
    #: where this operator's resources are (it may have put finalizers there)
    namespaces: set[str] = field(default_factory=set)

    def event_once(self, body: kopf.Body, reason: str, message: str, warning: bool = False) -> None:
        """An Event, unless the last one of this resource with this reason said the same: a handler kopf retries
        (a deletion waiting for a Restore, storage that keeps failing) would otherwise post a new Event each time."""
        key = ((body.get("metadata") or {}).get("uid"), reason)
        if self.posted.get(key) == message:
            return
        self.posted[key] = message
        (kopf.warn if warning else kopf.info)(body, reason=reason, message=message[:1024])

    def stack_key(self, namespace: str, selector: SelectorSpec) -> str:
        """The stack a selector picks in a namespace (the key of its lock)."""
        return f"{namespace}/{pod_selector(selector, self.settings)}"


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


def pod_selector(selector: SelectorSpec, operator: OperatorSettings) -> str:
    """The label selector of a spec's pods: always within the operator's release."""
    return selector_string(
        selector.match_labels,
        operator.release,
        operator.selector,
        [e.requirement() for e in selector.match_expressions],
    )


async def discover(
    namespace: str, selector: SelectorSpec, context: Context, terminating_ok: bool = False
) -> list[ParticipantRef]:
    """The stack's participants; :class:`StackRolling` while a StatefulSet of it rolls out or a pod of it is
    not running (the caller waits), :class:`DiscoveryError` when it cannot be a stack. ``terminating_ok`` (a final
    checkpoint, which cannot wait for a rollout: its pods are going away): pods being deleted take part, and a
    StatefulSet that is not settled is no reason to wait; a pod that is not running still is."""
    labels = pod_selector(selector, context.settings)
    pods = await context.kube.list_pods(namespace, labels)
    statefulsets = [
        s for s in await context.kube.list_statefulsets(namespace) if selector_matches(labels, template_labels(s))
    ]
    rolling = [] if terminating_ok else rollout_problems(statefulsets, pods)
    if rolling:
        raise StackRolling("; ".join(rolling))
    replicas = {str(s.metadata.name): 1 if s.spec.replicas is None else int(s.spec.replicas) for s in statefulsets}
    check_replica_counts(pods, {name: replicas.get(name) for name in replicated_statefulsets(pods)})
    refs = participants_from_pods(pods, terminating_ok=terminating_ok)
    if not refs:
        raise DiscoveryError(f"no participant pods match {labels!r} in {namespace}")
    return refs


def location(name: str, operator: OperatorSettings) -> StorageLocation:
    """The storage location a spec names; :class:`Refused` (``UnknownStorageLocation``) when the admin has none."""
    try:
        return operator.location(name)
    except UnknownLocation as exc:
        raise Refused("UnknownStorageLocation", str(exc)) from None


async def storage_access(
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
