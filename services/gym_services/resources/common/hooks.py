"""What a resources server implements so its sessions can be saved and restored (``exported`` mode).

The session participant (:class:`gym_services.resources.common.participant.ExportedParticipant`)
calls these hooks; the server's session store implements them. Restore is two steps, so a
participant's ``validate`` changes nothing: :meth:`SessionHooks.stage_session_states` checks every
state and builds what :meth:`SessionHooks.install_session_states` then puts in place.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from gym_services.control.interfaces import interface_problems

#: what a store's ``stage_session_states`` builds and its ``install_session_states`` takes
S = TypeVar("S")


@runtime_checkable
class SessionHooks(Protocol[S]):
    """The session store of an ``exported`` server, keyed by cookie session id.

    States are JSON values: a store exports what ``json.dumps`` takes, and is handed back whatever a
    checkpoint held (``object``: the store checks it)."""

    def export_session_states(self) -> Mapping[str, object]:
        """JSON-serializable state per live session; sessions no longer held are left out."""

    def stage_session_states(self, states: Mapping[str, object]) -> S:
        """Check every state and build what :meth:`install_session_states` needs; change nothing.

        Raise :class:`~gym_services.control.participant.InvalidState` for any state that is not
        valid: then nothing is installed anywhere (``422 invalid_state``)."""

    def install_session_states(self, staged: S) -> None:
        """Put what :meth:`stage_session_states` built in place; must not fail."""

    def retire_session_state(self, session_id: str) -> None:
        """Drop the session."""


@runtime_checkable
class SharedStateHooks(SessionHooks[S], Protocol[S]):
    """Optional: state shared by many sessions (e.g. pristine tables), written once per checkpoint; the
    store stages sessions against the shared states a checkpoint held."""

    def export_shared_states(self) -> Mapping[str, object]:
        """JSON-serializable state per shared name (written as ``shared-<name>``)."""

    def stage_session_states(self, states: Mapping[str, object], shared: Mapping[str, object] | None = None) -> S:
        """As :meth:`SessionHooks.stage_session_states`, against ``shared`` (name -> state) when given."""


class RetiresSessions(Protocol):
    """Any store a session participant drops sessions from (retire, a new seed, an undone restore)."""

    def retire_session_state(self, session_id: str) -> None: ...


@dataclass(frozen=True)
class SessionCapture:
    """What a store froze under a checkpoint's pause, to be encoded after the stack resumed.

    ``sessions``: session id -> (change token, frozen session). The token differs whenever the session
    may have changed since an earlier capture, so an equal token lets the participant reuse that
    encoding. ``shared``: name -> frozen shared state. Both are data, never live state: the store's
    :meth:`CapturesSessions.encode_captured_session` and :meth:`CapturesSessions.encode_captured_shared`
    turn them into JSON-serializable states later (in a worker thread or a forked child, while tools run again).
    """

    sessions: Mapping[str, tuple[Hashable, object]]
    shared: Mapping[str, object] = field(default_factory=dict)


@runtime_checkable
class CapturesSessions(Protocol):
    """Optional: a store that can freeze every session in O(1) each, so the pause stays short. What it froze
    is opaque to the participant (``Any``: each store's own frozen form), handed back to its encode hooks."""

    def capture_session_states(self) -> SessionCapture: ...

    def encode_captured_session(self, frozen: Any) -> object:
        """The state ``export_session_states`` would have returned for the session at capture time, from what
        :meth:`capture_session_states` froze; reads only ``frozen`` and changes nothing."""

    def encode_captured_shared(self, frozen: Any) -> object:
        """The state ``export_shared_states`` would have returned for it at capture time, from ``frozen``."""


#: the methods every ``exported`` store implements (:class:`SessionHooks`)
SESSION_HOOKS = ("export_session_states", "stage_session_states", "install_session_states", "retire_session_state")
#: the methods of a store with shared state (:class:`SharedStateHooks`): one of them makes it one
SHARED_STATE_HOOKS = ("export_shared_states", "stage_session_states")
#: the methods of a store that captures in O(1) per session (:class:`CapturesSessions`): one of them makes it one
CAPTURE_HOOKS = ("capture_session_states", "encode_captured_session", "encode_captured_shared")


def session_hook_problems(store: object) -> list[str]:
    """What keeps ``store`` from being the session store of an ``exported`` server: each hook it lacks, or has
    with another signature, named with its signature here. A store with one of the optional hooks
    (:class:`SharedStateHooks`, :class:`CapturesSessions`) needs all of that set."""
    problems = interface_problems(store, SessionHooks, SESSION_HOOKS)
    if hasattr(store, "export_shared_states"):
        problems += interface_problems(store, SharedStateHooks, SHARED_STATE_HOOKS)
    if any(hasattr(store, name) for name in CAPTURE_HOOKS):
        problems += interface_problems(store, CapturesSessions, CAPTURE_HOOKS)
    return list(dict.fromkeys(problems))
