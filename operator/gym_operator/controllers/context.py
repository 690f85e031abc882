"""What every controller shares: the operator's settings and clients, the stack's discovery, Events.

One :class:`Context` per operator process, built by kopf's startup handler (:func:`gym_operator.handlers.startup`)
and kept in kopf's memo; each controller gets it from there. Nothing here knows a lifecycle.
"""

from __future__ import annotations

import asyncio
import re
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
from gym_operator.leadership import Leadership
from gym_operator.specs import OperatorSettings, SelectorSpec
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.coordinator import TransactionPhase

#: the finalizer every release's operator shared before each had its own; an operator takes it off its release's
#: resources (nothing holds it any more)
LEGACY_FINALIZER = "gym-checkpoint.dev/operator"
#: the phases a transaction ends in
FINAL = (TransactionPhase.COMPLETED, TransactionPhase.FAILED)


def finalizer_of(release: str) -> str:
    """The finalizer of the operator of ``release``, on the release's resources that need it at their deletion.

    One per release: kopf takes its finalizer off every resource none of its handlers match, so the operators of two
    releases sharing one finalizer in a namespace would each take the other's off, and the other put it back, for
    ever. (A release name is at most 53 characters: the name part stays within a qualified name's 63.)"""
    return f"gym-checkpoint.dev/operator-{release}"


def claimed_by(namespace: str, name: str, release: str) -> str:
    """Who a Checkpoint's transaction is, as its stored claim says (``claimed_by``): the resource and its release,
    so a Restore by checkpoint id can tell which release took it (:func:`claimed_release`)."""
    return f"Checkpoint {namespace}/{name} (release {release})"


_CLAIMED_RELEASE = re.compile(r"\(release ([a-z0-9]([-a-z0-9]*[a-z0-9])?)\)$")


def claimed_release(claimed: str) -> str | None:
    """The release a stored claim names (:func:`claimed_by`); None for one made elsewhere (the CLI) or before."""
    match = _CLAIMED_RELEASE.search(claimed)
    return match.group(1) if match else None


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
    #: the release's leadership this replica holds (None: run without leader election, as ``kopf run`` does)
    leadership: Leadership | None = None
    #: one lock per stack (namespace and selector): one transaction at a time on it
    locks: dict[str, StackLock] = field(default_factory=dict)
    #: resource uid -> an Event set once its transaction has ended (a deletion waits for it)
    running: dict[str, asyncio.Event] = field(default_factory=dict)
    #: (resource uid, reason) -> the message of the last Event posted with it
    posted: dict[tuple[str | None, str], str] = field(default_factory=dict)
    #: where this operator's resources are (it may have put finalizers there)
    namespaces: set[str] = field(default_factory=set)
    #: resource uid -> (plural, namespace, name) of those the watch last showed holding this operator's finalizer
    held: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def fence(self) -> str | None:
        """Called right before every control call and status write: the leader's term to name on it (None: no
        leader election); a leader whose leadership may have passed ends here (:meth:`Leadership.fence`)."""
        return self.leadership.fence() if self.leadership is not None else None

    def seen(self, plural: str, event_type: str | None, body: kopf.Body) -> None:
        """One watch event of a resource of the release: where the release's resources are, which hold the
        finalizer."""
        meta = body.get("metadata") or {}
        self.namespaces.add(str(meta.get("namespace")))
        uid = str(meta.get("uid"))
        if event_type != "DELETED" and finalizer_of(self.settings.release) in (meta.get("finalizers") or []):
            self.held[uid] = (plural, str(meta.get("namespace")), str(meta.get("name")))
        else:
            self.held.pop(uid, None)

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
