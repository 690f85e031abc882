"""How long the coordinator waits for each control call, derived from a transaction's settings.

Defined once here; the participant set (:mod:`gym_services.coordination.participants`) carries them and
the two transactions (:mod:`~gym_services.coordination.checkpoint`, :mod:`~gym_services.coordination.restore`)
read them.
The lease and prepare-timeout defaults themselves are protocol values
(:data:`~gym_services.control.protocol.DEFAULT_LEASE_S`,
:data:`~gym_services.control.protocol.DEFAULT_PREPARE_TIMEOUT_S`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadlines:
    #: a prepare call may take the participant's deadline plus this (its answer has to travel back)
    prepare_margin_s: float = 10.0
    #: a role prepared after the others still gets at least this much of the prepare deadline
    min_prepare_s: float = 0.05
    #: a restore call waits at least this long ...
    restore_min_s: float = 60.0
    #: ... or this many leases (reading and verifying every record takes a while)
    restore_leases: float = 4.0
    #: a persist call (waiting for a background upload) waits at least this long ...
    persist_min_s: float = 120.0
    #: ... plus this long per record captured (encoding is the slow part)
    persist_per_record_s: float = 0.02
    #: leases are renewed this many times per lease period (a renewal may fail twice before it runs out)
    renewals_per_lease: float = 3.0
    #: and never more often than this
    min_renew_interval_s: float = 0.05

    def prepare_remaining(self, deadline: float) -> float:
        """Seconds left until the monotonic ``deadline`` for the next role to prepare."""
        return max(self.min_prepare_s, deadline - time.monotonic())

    def prepare_call(self, remaining_s: float) -> float:
        return remaining_s + self.prepare_margin_s

    def restore_call(self, lease_s: float) -> float:
        return max(self.restore_min_s, lease_s * self.restore_leases)

    def persist_call(self, records: int) -> float:
        return self.persist_min_s + records * self.persist_per_record_s

    def renew_interval(self, lease_s: float) -> float:
        return max(self.min_renew_interval_s, lease_s / self.renewals_per_lease)

    def renew_call(self, lease_s: float) -> float:
        return lease_s / self.renewals_per_lease


DEADLINES = Deadlines()
