"""NeMo Gym's session cookie mapped onto the participant's sessions (:class:`NemoSessions`).

It runs inside NeMo Gym's own session middleware (which decodes the signed cookie into ``scope["session"]`` and gives
a new session its ``session_id``), around every data route of the adopted app:

- a session the participant retired (its episode moved on to a new attempt) is ``409 stale_attempt``;
- the rollout and attempt of a call's identity headers are written into NeMo Gym's signed session, so the session
  knows its attempt: a call that carries the session's cookie and no identity headers is checked against the
  attempt fence under the identity the session was last used with (a late call of an old attempt is refused
  however it is sent);
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
from gym_services.control.fencing import AttemptFence
from gym_services.resources.common.participant import SessionParticipant

#: the key of NeMo Gym's session id in its session (``nemo_gym.server_utils.SESSION_ID_KEY``)
SESSION_ID_KEY = "session_id"
#: the identity a session was last used with, kept in NeMo Gym's signed session
ROLLOUT_KEY = "gym_checkpoint_rollout_id"
ATTEMPT_KEY = "gym_checkpoint_attempt"
SEED_PATH = "/seed_session"
END_PATHS = ("/verify",)


def signed_identity(session: dict[str, Any]) -> RolloutIdentity | None:
    """The identity the signed session was last used with, or None."""
    rollout_id, attempt = session.get(ROLLOUT_KEY), session.get(ATTEMPT_KEY)
    if not isinstance(rollout_id, str) or not isinstance(attempt, int):
        return None
    try:
        return RolloutIdentity(rollout_id=rollout_id, attempt=attempt)
    except ValueError:
        return None


class NemoSessions:
    """See the module."""

    def __init__(
        self, app: ASGIApp, participant: SessionParticipant[Any, Any], hooks: NemoSessionHooks, fence: AttemptFence
    ) -> None:
        self.app = app
        self.participant = participant
        self.hooks = hooks
        self.fence = fence

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
            if identity is None:
                signed = signed_identity(session)
                if signed is not None:
                    self.fence.check(signed)
            else:
                session[ROLLOUT_KEY], session[ATTEMPT_KEY] = identity.rollout_id, identity.attempt
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        path = scope["path"]
        status = 500

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
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
