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
    ) -> None:
        self.settings, self.api, self.clock = settings, api, clock
        self.leader = False
        self.holder: str | None = None  # the holder last read (for logs and the liveness answer)
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    # --- one attempt ------------------------------------------------------------------------------------

    def _observe(self, record: client.V1Lease, now: float) -> None:
        version = record.metadata.resource_version if record.metadata else None
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        self.holder = record.spec.holder_identity if record.spec else None

    def try_acquire_or_renew(self, timeout_s: float) -> bool:
        """One conditional read-and-write: True when this candidate holds the Lease afterwards."""
        s = self.settings
        now, stamp = self.clock(), _micro_now()
        duration = math.ceil(s.duration_s)
        try:
            record = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=timeout_s)
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
                created = self.api.create_namespaced_lease(s.namespace, body, _request_timeout=timeout_s)
            except ApiException as exc2:
                if exc2.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(created, now)
            return True
        self._observe(record, now)
        spec = record.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        held_for = spec.lease_duration_seconds or duration
        if holder and holder != s.identity and now < self._observed_at + held_for:
            return False  # another holder, whose record changed less than a leadership's duration ago (seen here)
        if holder != s.identity:
            spec.acquire_time = stamp
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if holder else 0)
        spec.holder_identity, spec.renew_time, spec.lease_duration_seconds = s.identity, stamp, duration
        record.spec = spec
        try:  # record.metadata.resourceVersion makes this conditional: 409 when anyone wrote since the read
            updated = self.api.replace_namespaced_lease(s.name, s.namespace, record, _request_timeout=timeout_s)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._observe(updated, now)
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
                    self.leader, self._renewed_at = True, self.clock()
                    log.info(
                        f"became the leader: holding Lease {s.namespace}/{s.name} as {s.identity}",
                        extra={"leadership": s.name, "identity": s.identity, "leader": True},
                    )
                    return True
                note = f"standing by: Lease {s.namespace}/{s.name} is held by {self.holder}"
            except Exception as exc:  # no answer, 5xx, 403: keep trying, say why once
                note = f"standing by: Lease {s.namespace}/{s.name} could not be read or written ({exc})"
            if note != said:
                log.info(note, extra={"leadership": s.name, "identity": s.identity, "holder": self.holder})
                said = note
            self._pause(stop)
        return False

    def keep(self, stop: threading.Event, lost: Callable[[str], None]) -> None:
        """Renew every retry period until ``stop``; ``lost(why)`` once no renewal succeeded for the renew
        deadline, or the Lease names another holder (``lost`` is expected not to return: the process exits)."""
        s = self.settings
        while not self._pause(stop):
            deadline = self._renewed_at + s.renew_deadline_s
            why = ""
            while not stop.is_set():
                left = deadline - self.clock()
                if left <= 0:
                    why = why or f"no renewal succeeded for {s.renew_deadline_s:g}s"
                    break
                try:
                    if self.try_acquire_or_renew(timeout_s=max(left, 0.1)):
                        self._renewed_at = self.clock()
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
