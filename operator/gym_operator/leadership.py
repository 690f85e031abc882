"""Leadership: of a release's operator replicas, only the holder of the Kubernetes Lease (``coordination.k8s.io/v1``)
acts.

The operator's replicas (:mod:`gym_operator.main`) each run a candidate; the one holding the Kubernetes Lease runs
kopf (the handlers, so the coordinator), the others stand by, answering their liveness probe and retrying:

- A candidate takes the Lease when it has no holder, or when its record (its ``resourceVersion``) has not changed
  for the leadership's duration (the Lease's ``leaseDurationSeconds``) as the candidate itself has watched it. Only
  the candidate's own monotonic clock is used: the holder's ``renewTime`` is another machine's clock and is never
  compared with this one.
- Every write is conditional: the create fails with 409 AlreadyExists when another candidate created it first,
  the update carries the ``resourceVersion`` read and fails with 409 Conflict when anyone wrote in between.
  Two candidates can therefore never both hold the Lease.
- The holder renews every ``retry_period_s``. When no renewal succeeded for ``renew_deadline_s`` (shorter than
  the leadership's duration), or the Lease names another holder, it has lost the Lease: the process exits at once
  (:data:`EXIT_LOST`), before any other candidate may take it, so a stalled or partitioned leader stops acting
  before a new one starts. Renewal runs on its own thread, so a busy event loop cannot delay it.
- A holder stopping normally (SIGTERM: a rolling update, a drain) releases the Lease: a standby takes it at its
  next retry instead of waiting out the leadership's duration.
- One attempt (a read and a write) is bounded by one deadline, as client-go's context bounds it: the renewal's
  calls share what is left of the renew deadline, never each the whole of it.
- Fencing: each leadership is a term, the Lease's ``leaseTransitions`` (one more at every change of holder, as
  client-go counts them). While it holds the Lease the holder knows until when it surely does: the start of its last
  successful renewal plus the renew deadline, on its own clock (another candidate may take over only once the
  record went unchanged for the longer leadership duration). :meth:`Leadership.fence` ends the process
  (:attr:`Leadership.on_lost`, as losing the Lease does) past that instant and otherwise names the term
  (:data:`~gym_services.control.protocol.LEADER_TERM_HEADER`); the operator calls it right before every control
  call and status write, so a leader frozen past the end of its term (SIGSTOP, a paused VM, CPU throttling) sends
  nothing after it wakes, whatever its threads do first. The servers refuse a call of an older term than one they
  have seen (``docs/protocol.md``, "Kubernetes"), and status writes are conditional on the resource's
  ``resourceVersion``, which closes the instant between the check and the write.
- Uninstall: the chart's pre-delete hook marks the Lease (annotation :data:`UNINSTALLING`, whose value is the uid of
  the operator Deployment being uninstalled: :mod:`gym_operator.uninstall`). A marked Lease is never taken; its
  holder steps down (:mod:`gym_operator.main`): it stops its handlers, lets go of the release's finalizers while its
  RBAC is still there (Helm deletes the operator's Role, RoleBinding and ServiceAccount in the same pass as its
  Deployment, before the pod gets SIGTERM), releases the Lease and stands by until it is stopped. The Lease outlives
  the release (Helm does not own it): the operators of a later install under the same name, whose Deployment has
  another uid, ignore the old mark, and their leader removes it.

What a new leader finds half done (a Checkpoint or Restore left in ``Preparing`` by the old one) it carries on
under the same transaction id; the coordinator and the servers are idempotent per id (``docs/protocol.md``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_operator.specs import SpecError

log = logging.getLogger("gym.operator.leader")

#: the exit status of an operator that lost its Lease (Kubernetes restarts it; it then stands by)
EXIT_LOST = 3
#: client-go's jitter: retries spread over [period, 1.2 * period] so candidates do not write in lockstep
JITTER = 0.2
#: the annotation the chart's pre-delete hook puts on the Kubernetes Lease: the release is being uninstalled (its
#: value is when); nobody takes a marked Lease, and its holder steps down
UNINSTALLING = "gym-checkpoint.dev/uninstalling"


class LeadershipLost(Exception):
    """This replica no longer surely holds the leadership: nothing may be sent in its name."""


class LeadershipSettings(BaseModel):
    """Which Kubernetes Lease, who this candidate is, and client-go's three durations (its defaults: 15 s, 10 s,
    2 s)."""

    model_config = ConfigDict(frozen=True)

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1, description="GYMCKPT_LEADER_LEASE: the Kubernetes Lease's name (the chart's)")
    identity: str = Field(min_length=1, description="this candidate: its pod name and a random suffix")
    duration_s: float = Field(
        default=15.0, gt=0, description="GYMCKPT_LEADER_LEASE_SECONDS: how long a leadership lasts unrenewed"
    )
    renew_deadline_s: float = Field(default=10.0, gt=0, description="GYMCKPT_LEADER_RENEW_DEADLINE_SECONDS")
    retry_period_s: float = Field(default=2.0, gt=0, description="GYMCKPT_LEADER_RETRY_SECONDS")

    @model_validator(mode="after")
    def _ordered(self) -> LeadershipSettings:
        if not self.duration_s > self.renew_deadline_s > self.retry_period_s * (1 + JITTER):
            raise ValueError(
                "need leadership duration > renew deadline > 1.2 x retry period (a leader must give up before anyone "
                f"may take over), got {self.duration_s:g}s, {self.renew_deadline_s:g}s, "
                f"{self.retry_period_s:g}s"
            )
        return self

    @classmethod
    def from_env(cls, namespace: str, env: Mapping[str, str] | None = None) -> LeadershipSettings:
        env = os.environ if env is None else env
        release = env.get("GYMCKPT_RELEASE") or ""
        pod = env.get("POD_NAME") or socket.gethostname()
        fields: dict[str, Any] = {
            "namespace": namespace,
            "name": env.get("GYMCKPT_LEADER_LEASE") or (f"{release}-gym-checkpoint-operator" if release else ""),
            "identity": f"{pod}_{uuid.uuid4().hex[:10]}",
        }
        for key, name in (
            ("duration_s", "GYMCKPT_LEADER_LEASE_SECONDS"),
            ("renew_deadline_s", "GYMCKPT_LEADER_RENEW_DEADLINE_SECONDS"),
            ("retry_period_s", "GYMCKPT_LEADER_RETRY_SECONDS"),
        ):
            if env.get(name):
                fields[key] = env[name]
        try:
            return cls(**fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'leader election'}: {e['msg']}" for e in exc.errors()
            )
            raise SpecError(f"leader election settings: {problems}") from None


def _micro_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Leadership:
    """One candidate for the leadership of a release (its Kubernetes Lease). :meth:`acquire` blocks until it holds
    it; :meth:`keep` renews it."""

    def __init__(
        self,
        settings: LeadershipSettings,
        api: client.CoordinationV1Api,
        clock: Callable[[], float] = time.monotonic,
        instance: str | None = None,
    ) -> None:
        """``instance``: the uid of the operator's Deployment (an uninstall mark of another is stale); None when
        unknown (no Deployment: every mark counts)."""
        self.settings, self.api, self.clock, self.instance = settings, api, clock, instance
        #: what a fence that finds the leadership gone calls first (the process's exit; None: it only raises)
        self.on_lost: Callable[[str], None] | None = None
        self.leader = False
        self.holder: str | None = None  # the holder last read (for logs and the liveness answer)
        self.term: int | None = None  # the Lease's leaseTransitions while this candidate holds it
        self.read_at: float | None = None  # on self.clock: when the Lease was last read (or written) here
        self.uninstalling: str | None = None  # the uninstall mark last read (the pre-delete hook's)
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._valid_until = 0.0  # on self.clock: until when this candidate surely holds the Lease

    # --- fencing ------------------------------------------------------------------------------------------

    def watching(self) -> bool:
        """Whether this candidate read the Lease within the leadership's duration (a standby that can take over)."""
        return self.read_at is not None and self.clock() - self.read_at <= self.settings.duration_s

    def valid(self) -> bool:
        """Whether this candidate surely holds the Lease now (its last renewal is recent enough on its own clock)."""
        return self.leader and self.clock() < self._valid_until

    def fence(self) -> str:
        """The term to name on a call or write made now (``<namespace>/<Lease name>/<term>``). When this candidate may
        no longer hold the Lease: :attr:`on_lost` (the process ends), else :class:`LeadershipLost`."""
        if not self.valid():
            why = (
                f"not surely the leader of {self.settings.namespace}/{self.settings.name} any more (term {self.term}, "
                "its last renewal too long ago on this clock): nothing more is sent in its name"
            )
            if self.on_lost is not None:
                self.on_lost(why)
            raise LeadershipLost(why)
        return f"{self.settings.namespace}/{self.settings.name}/{self.term}"

    # --- one attempt ------------------------------------------------------------------------------------

    def _observe(self, record: client.V1Lease, now: float) -> None:
        self.read_at = now
        version = record.metadata.resource_version if record.metadata else None
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        self.holder = record.spec.holder_identity if record.spec else None
        self.uninstalling = self._mark(record)

    def _mark(self, record: client.V1Lease) -> str | None:
        """The uninstall mark that concerns this release's operators (a stale one, of an earlier install: None)."""
        mark = ((record.metadata.annotations if record.metadata else None) or {}).get(UNINSTALLING)
        if mark and self.instance is not None and mark != self.instance:
            return None
        return str(mark) if mark else None

    def _held(self, record: client.V1Lease, started: float) -> None:
        """This candidate holds the Lease as ``record`` says, renewed by an attempt that started at ``started``."""
        self.term = (record.spec.lease_transitions if record.spec else None) or 0
        self._valid_until = started + self.settings.renew_deadline_s

    def try_acquire_or_renew(self, timeout_s: float) -> bool:
        """One conditional read-and-write, both within ``timeout_s`` in all: True when this candidate holds the Lease
        afterwards. A Lease the uninstall marked is only renewed by its holder, never taken."""
        s = self.settings
        now, stamp = self.clock(), _micro_now()
        deadline = now + timeout_s
        duration = math.ceil(s.duration_s)

        def left() -> float:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise TimeoutError(f"the attempt ran out of its {timeout_s:.1f}s")
            return remaining

        try:
            record = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=left())
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=s.name, namespace=s.namespace),
                spec=client.V1LeaseSpec(
                    holder_identity=s.identity,
                    lease_duration_seconds=duration,
                    acquire_time=stamp,
                    renew_time=stamp,
                    lease_transitions=0,
                ),
            )
            try:
                created = self.api.create_namespaced_lease(s.namespace, body, _request_timeout=left())
            except ApiException as exc2:
                if exc2.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(created, now)
            self._held(created, now)
            return True
        self._observe(record, now)
        spec = record.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        held_for = spec.lease_duration_seconds or duration
        if holder != s.identity and self.uninstalling:
            return False  # the release is being uninstalled: nobody takes over
        if holder and holder != s.identity and now < self._observed_at + held_for:
            return False  # another holder, whose record changed less than a leadership's duration ago (seen here)
        if holder != s.identity:  # a new term (client-go counts every change of holder, from none too)
            spec.acquire_time = stamp
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time, spec.lease_duration_seconds = s.identity, stamp, duration
        record.spec = spec
        annotations = (record.metadata.annotations if record.metadata else None) or {}
        if record.metadata is not None and annotations.get(UNINSTALLING) and not self.uninstalling:
            record.metadata.annotations = {k: v for k, v in annotations.items() if k != UNINSTALLING}  # stale
        try:  # record.metadata.resourceVersion makes this conditional: 409 when anyone wrote since the read
            updated = self.api.replace_namespaced_lease(s.name, s.namespace, record, _request_timeout=left())
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._observe(updated, now)
        self._held(updated, now)
        return True

    # --- loops --------------------------------------------------------------------------------------------

    def _pause(self, stop: threading.Event) -> bool:
        return stop.wait(self.settings.retry_period_s * (1 + random.random() * JITTER))

    def acquire(self, stop: threading.Event) -> bool:
        """Retry until this candidate holds the Lease (True) or ``stop`` is set (False)."""
        s = self.settings
        said = None
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew(timeout_s=s.renew_deadline_s):
                    self.leader = True
                    log.info(
                        f"became the leader: holding Lease {s.namespace}/{s.name} as {s.identity}",
                        extra={"leadership": s.name, "identity": s.identity, "leader": True},
                    )
                    return True
                note = f"standing by: Lease {s.namespace}/{s.name} is held by {self.holder}"
                if self.uninstalling:
                    note = f"standing by: the release is being uninstalled (operator Deployment {self.uninstalling})"
            except Exception as exc:  # no answer, 5xx, 403: keep trying, say why once
                note = f"standing by: Lease {s.namespace}/{s.name} could not be read or written ({exc})"
            if note != said:
                log.info(note, extra={"leadership": s.name, "identity": s.identity, "holder": self.holder})
                said = note
            self._pause(stop)
        return False

    def keep(
        self, stop: threading.Event, lost: Callable[[str], None], step_down: Callable[[str], None] | None = None
    ) -> None:
        """Renew every retry period until ``stop``; ``lost(why)`` once no renewal succeeded for the renew
        deadline, or the Lease names another holder (``lost`` is expected not to return: the process exits);
        ``step_down(mark)`` once, when the Lease is marked for the release's uninstall (renewing goes on until
        ``stop``, so the leader lets go of the release's finalizers as the leader)."""
        s = self.settings
        stepping_down = False
        while not self._pause(stop):
            deadline = self._valid_until  # the last renewal's start plus the renew deadline
            why = ""
            while not stop.is_set():
                left = deadline - self.clock()
                if left <= 0:
                    why = why or f"no renewal succeeded for {s.renew_deadline_s:g}s"
                    break
                try:
                    if self.try_acquire_or_renew(timeout_s=left):
                        why = ""
                        break
                    if self.holder and self.holder != s.identity:
                        why = f"the Lease is held by {self.holder}"
                        break
                    why = "the renewal conflicted with another write"
                except Exception as exc:
                    why = f"renewing failed: {exc}"
                stop.wait(min(s.retry_period_s / 4, max(deadline - self.clock(), 0)))
            if why and not stop.is_set():
                self.leader = False
                lost(f"lost Lease {s.namespace}/{s.name}: {why}")
                return
            if self.uninstalling and step_down is not None and not stepping_down:
                stepping_down = True
                step_down(self.uninstalling)

    def release(self) -> None:
        """Give the leadership up (holder cleared), if this candidate holds it; best effort."""
        if not self.leader:
            return
        self.leader = False
        s = self.settings
        try:
            record = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=s.renew_deadline_s)
            if record.spec is None or record.spec.holder_identity != s.identity:
                return
            stamp = _micro_now()
            record.spec.holder_identity = None
            record.spec.lease_duration_seconds = 1
            record.spec.renew_time = record.spec.acquire_time = stamp
            self.api.replace_namespaced_lease(s.name, s.namespace, record, _request_timeout=s.renew_deadline_s)
            log.info(f"released Lease {s.namespace}/{s.name}", extra={"leadership": s.name})
        except Exception as exc:
            log.warning(f"releasing Lease {s.namespace}/{s.name} failed ({exc}); it expires by itself")
