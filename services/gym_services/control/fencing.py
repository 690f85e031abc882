"""Fencing: the highest attempt seen per rollout wins (``docs/protocol.md``, "Identity and fencing"); the highest
leader term seen per leadership wins (``docs/protocol.md``, "Kubernetes").

One per server, inside its :class:`~gym_services.control.admission.Admission`: the admission middleware
checks and records every data request's attempt, the control plane advances it at restore and retire.

Only rollouts past their first attempt are remembered: a rollout the fence does not know is at attempt 0, the
first, and no attempt is older than that, so remembering it refuses nothing more. The fence then grows with the
episodes a restore or a retire moved on, not with every rollout the server ever saw (about 100 bytes each: in a
server that runs for weeks, hundreds of thousands of rollouts a day).
"""

from __future__ import annotations

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity


class AttemptFence:
    """Remembers the highest attempt per rollout past its first; older attempts are refused and change nothing."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}

    def __len__(self) -> int:
        """Rollouts remembered (those past attempt 0)."""
        return len(self._highest)

    def highest(self, rollout_id: str) -> int | None:
        """The highest attempt seen past the first; None for a rollout at attempt 0 (or never seen)."""
        return self._highest.get(rollout_id)

    def check(self, identity: RolloutIdentity) -> None:
        """Raise ``409 stale_attempt`` for a call from an older attempt; records nothing."""
        highest = self._highest.get(identity.rollout_id)
        if highest is not None and identity.attempt < highest:
            raise ApiError(
                ErrorCode.STALE_ATTEMPT,
                f"rollout {identity.rollout_id!r} attempt {identity.attempt} is stale: attempt {highest} is current",
                details={"rollout_id": identity.rollout_id, "attempt": identity.attempt, "current": highest},
            )

    def observe(self, identity: RolloutIdentity) -> None:
        """Check, then remember the attempt if it is newer (and past the first)."""
        self.check(identity)
        self.advance(identity.rollout_id, identity.attempt)

    def advance(self, rollout_id: str, attempt: int) -> None:
        """Make ``attempt`` the oldest one still accepted (restore, retire)."""
        if attempt > self._highest.get(rollout_id, 0):
            self._highest[rollout_id] = attempt


class LeaderFence:
    """Remembers the highest term seen per leadership (a Kubernetes Lease: the operator's leader election); a control
    call naming an older term of a leadership is refused and changes nothing.

    A leader frozen past the end of its term (SIGSTOP, a paused VM) checks its own clock before every call and stops;
    this is the server's half: a call that was already on its way when the leader froze, sent after a newer leader
    called this server, is refused. Calls that name no term (the CLI, a local stack) are not fenced."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}

    def observe(self, value: str) -> None:
        """Check the header's ``<leadership>/<term>``, then remember the term if it is newer; ``400`` for a malformed
        value, ``409 stale_leader`` for an older term."""
        leadership, sep, raw = value.strip().rpartition("/")
        try:
            term = int(raw)
        except ValueError:
            term = -1
        if not sep or not leadership or term < 0:
            raise ApiError(ErrorCode.BAD_REQUEST, f"leader term {value!r}: expected <leadership>/<term>")
        highest = self._highest.get(leadership)
        if highest is not None and term < highest:
            raise ApiError(
                ErrorCode.STALE_LEADER,
                f"leadership {leadership!r} term {term} is stale: term {highest} has called this server",
                details={"leadership": leadership, "term": term, "current": highest},
            )
        self._highest[leadership] = term
