"""The vocabulary of the checkpoint control protocol: roles, modes, phases, verbs, defaults.

Defined once here and imported by both ends of the wire: the control plane of every server
(:mod:`gym_services.control.plane`, :mod:`gym_services.control.routes`) and the coordinator's
client (:mod:`gym_services.coordination.client`). ``docs/protocol.md`` explains each term.
Every enum is a ``str`` enum, so members compare equal to (and serialize as) their wire values.
"""

from __future__ import annotations

import enum

#: where every server mounts its control routes
CONTROL_PREFIX = "/ng-control/v1/checkpoint"
#: seconds a paused participant waits for the coordinator before it aborts (or follows a restore's decision)
DEFAULT_LEASE_S = 30.0
#: seconds every participant gets to reach a boundary before the checkpoint fails on its blockers
DEFAULT_PREPARE_TIMEOUT_S = 30.0
#: a resources server's reply to ``/seed_session`` advertises its verify mode in this header
VERIFY_HEADER = "x-ng-checkpoint-verify"
#: a control call from a leader-elected coordinator (the Kubernetes operator) names its leadership and term:
#: ``<leadership>/<term>`` (the Kubernetes Lease's namespace/name and its leaseTransitions); a server refuses a call of
#: an older term of a leadership than one it has seen (``docs/protocol.md``, "Kubernetes")
LEADER_TERM_HEADER = "x-gym-leader-term"
#: a checkpoint not published within this long after its claim never is: the coordinator refuses to
#: publish (or carry on) past it, so deletion may then treat the checkpoint's objects as orphans
CHECKPOINT_IN_FLIGHT_S = 6 * 3600.0
#: how far apart hosts' clocks may be: a claim's time is its coordinator's, a deleter compares it with its own
CLOCK_SKEW_S = 600.0


class Role(enum.StrEnum):
    """What a participant is; the prepare order is :data:`ROLE_ORDER`."""

    CONTROLLER = "controller"
    ENVIRONMENT = "environment"
    MODEL = "model"
    AGENT = "agent"
    RESOURCES = "resources"


#: prepare order (``docs/protocol.md``, "Roles and the prepare order"); resume and abort reopen the servers agents
#: call first (``coordination.participants.REOPEN_ORDER``)
ROLE_ORDER: tuple[Role, ...] = (Role.CONTROLLER, Role.ENVIRONMENT, Role.MODEL, Role.AGENT, Role.RESOURCES)


class CheckpointMode(enum.StrEnum):
    """How a server's state reaches a checkpoint."""

    RESTART_ONLY = "restart_only"  # live sessions block a checkpoint; nothing is saved
    EXPORTED = "exported"  # state is written as records and restored
    STATELESS = "stateless"  # nothing to save; persist writes an empty manifest


class VerifyMode(enum.StrEnum):
    """Whether a verification may run again after a crash (``replay``) or must be waited for (``wait``)."""

    WAIT = "wait"
    REPLAY = "replay"


class Phase(enum.StrEnum):
    """Where one participant is: the phase of its control plane (:mod:`gym_services.control.plane`)."""

    FRESH = "fresh"
    OPEN = "open"
    PREPARING = "preparing"
    PREPARED = "prepared"
    BLOCKED = "blocked"
    CAPTURED = "captured"  # captured under the pause; ``persist`` writes it (before or after resume)
    RESTORING = "restoring"
    RESTORED = "restored"
    FINAL = "final"  # its part of a final checkpoint is written: admission stays closed until the process exits


#: phases in which data admission is open
OPEN_PHASES: frozenset[Phase] = frozenset({Phase.FRESH, Phase.OPEN})


class Verb(enum.StrEnum):
    """A control route: ``POST {CONTROL_PREFIX}/<verb>`` (``GET`` for ``status``)."""

    STATUS = "status"
    PREPARE = "prepare"
    CAPTURE = "capture"
    PERSIST = "persist"
    RESUME = "resume"
    ABORT = "abort"
    RESTORE = "restore"
    RETIRE = "retire"
    LEASE = "lease"

    @property
    def method(self) -> str:
        return "GET" if self is Verb.STATUS else "POST"

    @property
    def path(self) -> str:
        """The route under :data:`CONTROL_PREFIX`."""
        return f"/{self.value}"


#: the old name of :attr:`CheckpointMethod.BACKGROUND`, still read wherever a method is given (a deprecated alias)
DEPRECATED_BACKGROUND = "snapshot"


class CheckpointMethod(enum.StrEnum):
    """When a checkpoint's records reach storage (``docs/protocol.md``, "Transactions").

    Both take one path: ``capture`` takes an immutable capture under the pause, ``persist``
    encodes, packs, uploads and verifies it, the coordinator publishes. ``background`` resumes the
    stack before ``persist`` (the default: the pause ends at the capture); ``sync`` persists and
    publishes before it resumes (the rollouts wait until the checkpoint is published).

    :data:`DEPRECATED_BACKGROUND` is read as ``background`` (``CheckpointMethod(...)`` and every model with a
    method field): the CLI, a Checkpoint's spec and stored global manifests may still say it.
    """

    BACKGROUND = "background"
    SYNC = "sync"

    @classmethod
    def _missing_(cls, value: object) -> CheckpointMethod | None:
        return cls.BACKGROUND if value == DEPRECATED_BACKGROUND else None


class PersistState(enum.StrEnum):
    """Where a participant's background upload of a captured checkpoint is."""

    QUEUED = "queued"  # resumed; writing starts on the coordinator's ``persist`` (after every participant resumed)
    PERSISTING = "persisting"  # encoding and uploading
    PERSISTED = "persisted"  # every object written and verified, the participant manifest last
    FAILED = "failed"  # storage refused or the capture could not be encoded; nothing will publish it
    CANCELLED = "cancelled"  # the coordinator aborted the checkpoint (or the server is stopping)


class Decision(enum.StrEnum):
    """The outcome of a restore transaction, settled once in its decision object."""

    RESUME = "resume"
    ABORT = "abort"
