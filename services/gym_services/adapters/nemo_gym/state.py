"""What an adopted NeMo Gym server's author gives: where its per-session state is, and how it becomes JSON and back.

NeMo Gym's resources servers keep their state in a dict on the server object keyed by the session id of NeMo Gym's
session cookie (``request.session["session_id"]``). :class:`SessionDict` names that dict; ``export`` turns one
session's value into JSON (default: the value itself, when it already is JSON) and ``load`` turns it back (default:
a copy of the JSON). :class:`NemoSessionHooks` are the session hooks
(:class:`~gym_services.resources.common.hooks.SessionHooks`) of the server's participant, over that dict: they save
the sessions the participant tracks (the ones of live episodes), not every session the dict ever held.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from gym_services.control.participant import InvalidState


class SessionDict:
    """The dict attribute ``attribute`` of the server, keyed by NeMo Gym's session id."""

    def __init__(
        self,
        attribute: str,
        *,
        export: Callable[[Any], object] | None = None,
        load: Callable[[object], Any] | None = None,
    ) -> None:
        self.attribute = attribute
        self._export = export or copy.deepcopy
        self._load = load or copy.deepcopy

    def sessions(self, server: Any) -> MutableMapping[str, Any]:
        found = getattr(server, self.attribute, None)
        if not isinstance(found, MutableMapping):
            raise TypeError(f"{type(server).__name__}.{self.attribute} is not a dict keyed by session id")
        return found

    def holds(self, server: Any, session_id: str) -> bool:
        return session_id in self.sessions(server)

    def export(self, server: Any, session_id: str) -> object:
        return self._export(self.sessions(server)[session_id])

    def load(self, state: object) -> Any:
        """The value of a saved state; ``ValueError``, ``TypeError`` or ``KeyError`` for one that is not valid."""
        return self._load(state)

    def install(self, server: Any, session_id: str, value: Any) -> None:
        self.sessions(server)[session_id] = value

    def drop(self, server: Any, session_id: str) -> None:
        self.sessions(server).pop(session_id, None)


class NemoSessionHooks:
    """The session hooks of an adopted server over its :class:`SessionDict`. ``tracked`` lists the sessions of live
    episodes (the participant's, set once it exists)."""

    def __init__(self, server: Any, state: SessionDict) -> None:
        self.server = server
        self.state = state
        self.tracked: Callable[[], Iterable[str]] = lambda: ()

    def holds(self, session_id: str) -> bool:
        return self.state.holds(self.server, session_id)

    def export_session_states(self) -> Mapping[str, object]:
        return {sid: self.state.export(self.server, sid) for sid in list(self.tracked()) if self.holds(sid)}

    def stage_session_states(self, states: Mapping[str, object]) -> dict[str, Any]:
        staged = {}
        for sid, state in states.items():
            try:
                staged[sid] = self.state.load(state)
            except (ValueError, TypeError, KeyError) as exc:
                raise InvalidState(f"session {sid}: {type(exc).__name__}: {exc}") from None
        return staged

    def install_session_states(self, staged: dict[str, Any]) -> None:
        for sid, value in staged.items():
            self.state.install(self.server, sid, value)

    def retire_session_state(self, session_id: str) -> None:
        self.state.drop(self.server, session_id)
