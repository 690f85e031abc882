"""NeMo Gym's session cookie mapped onto the participant's sessions (:class:`NemoSessions`).

It runs inside NeMo Gym's own session middleware (which decodes the signed cookie into ``scope["session"]`` and gives
a new session its ``session_id``), around every data route of the adopted app:

- a session the participant retired (its episode moved on to a new attempt) is ``409 stale_attempt``;
- the rollout and attempt of the identity headers of the call that made the session, and of a newer attempt's
  admitted call, are written into NeMo Gym's signed session, so the session knows its newest attempt, as this
  package's own session cookie does (``base/sessions.py``). The session's id and identity go on the request's scope
  under the same keys that cookie's middleware uses, and the admission middleware inside this one fences the call
  by them (:func:`gym_services.control.admission.call_identity`): a late call of an old attempt is refused however
  it is sent;
- after a successful call the participant tracks the session (with the call's identity) while the server holds
  state for it; a successful ``/verify`` ends it; a ``/seed_session`` answer says the verify mode
  (``x-ng-checkpoint-verify``), as every participant's does.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_services.adapters.nemo_gym.state import NemoSessionHooks
from gym_services.base.errors import ApiError
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import SESSION_IDENTITY_KEY, SESSION_SCOPE_KEY, newer_identity
from gym_services.resources.common.participant import SessionParticipant

#: the key of NeMo Gym's session id in its session (``nemo_gym.server_utils.SESSION_ID_KEY``)
SESSION_ID_KEY = "session_id"
#: the newest identity the session was used with (``base/sessions.py``), kept in NeMo Gym's signed session
ROLLOUT_KEY = "gym_checkpoint_rollout_id"
ATTEMPT_KEY = "gym_checkpoint_attempt"
SEED_PATH = "/seed_session"
END_PATHS = ("/verify",)


def signed_identity(session: dict[str, Any]) -> RolloutIdentity | None:
    """The identity the signed session carries, or None."""
    rollout_id, attempt = session.get(ROLLOUT_KEY), session.get(ATTEMPT_KEY)
    if not isinstance(rollout_id, str) or not isinstance(attempt, int):
        return None
    try:
        return RolloutIdentity(rollout_id=rollout_id, attempt=attempt)
    except ValueError:
        return None


class NemoSessions:
    """See the module."""

    def __init__(self, app: ASGIApp, participant: SessionParticipant[Any, Any], hooks: NemoSessionHooks) -> None:
        self.app = app
        self.participant = participant
        self.hooks = hooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = scope.get("session")
        sid = session.get(SESSION_ID_KEY) if isinstance(session, dict) else None
        if scope["type"] != "http" or not isinstance(session, dict) or not isinstance(sid, str):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            self.participant.check_session(sid)
            identity = RolloutIdentity.from_headers(headers)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        signed = signed_identity(session)
        scope.setdefault("state", {}).update({SESSION_SCOPE_KEY: sid, SESSION_IDENTITY_KEY: signed})
        # the identity the session is signed with from this call on, once the call is admitted: the call's own for a
        # session made by it, a newer attempt of the session's rollout (a restored episode's)
        signing = identity if signed is None else newer_identity(signed, identity)
        path = scope["path"]
        status = 500

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if signing is not None and status < 400:  # NeMo Gym's session middleware signs it on the way out
                    session[ROLLOUT_KEY], session[ATTEMPT_KEY] = signing.rollout_id, signing.attempt
                if path == SEED_PATH:
                    extra = [(k.encode(), v.encode()) for k, v in self.participant.seed_headers().items()]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, answer)
        if status >= 400:
            return
        if path in END_PATHS:
            self.participant.end(sid)
        elif (path == SEED_PATH or sid not in self.participant.sessions) and self.hooks.holds(sid):
            self.participant.seeded(sid, headers)
