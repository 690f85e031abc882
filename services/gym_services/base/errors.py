"""JSON errors in the one form every server uses (``docs/protocol.md``, "Errors").

Every refusal is an :class:`ApiError` carrying an :class:`ErrorCode`; the app factory
(:mod:`gym_services.server.app`) turns it into ``{"error": {"code": ..., "message": ...}}``
with the code's HTTP status, so callers branch on ``code`` instead of parsing prose.
Raised by every layer; the only module that answers with it is the app factory.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI and the coordinator use the codes; only a server makes responses (starlette)
    from starlette.requests import Request
    from starlette.responses import JSONResponse


class ErrorCode(enum.StrEnum):
    """Every error code the stack answers with, and the HTTP status that goes with it."""

    status: int

    def __new__(cls, value: str, status: int) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        return member

    @classmethod
    def of(cls, value: str) -> ErrorCode:
        """The code named ``value``; ``ValueError`` for a string that is no code."""
        member = cls._value2member_map_.get(value)
        if not isinstance(member, ErrorCode):
            raise ValueError(f"{value!r} is not a valid {cls.__name__}")
        return member

    BAD_REQUEST = "bad_request", 400
    ROLLOUT_ID_REQUIRED = "rollout_id_required", 400
    PREFIX_MISMATCH = "prefix_mismatch", 400
    UNAUTHORIZED = "unauthorized", 401
    FORBIDDEN = "forbidden", 403
    NOT_FOUND = "not_found", 404
    SESSION_NOT_FOUND = "session_not_found", 404
    UNKNOWN_CHECKPOINT = "unknown_checkpoint", 404
    MODEL_NOT_FOUND = "model_not_found", 404
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    PAYLOAD_TOO_LARGE = "payload_too_large", 413
    STALE_ATTEMPT = "stale_attempt", 409
    STALE_LEADER = "stale_leader", 409  # a control call of a leader's term older than one the server has seen
    CHECKPOINT_PARKED = "checkpoint_parked", 409
    CHECKPOINT_BUSY = "checkpoint_busy", 409
    INVALID_PHASE = "invalid_phase", 409
    LEDGER_CONFLICT = "ledger_conflict", 409  # a token-ledger call id stored again with another payload
    LEDGER_CLOSED = "ledger_closed", 409  # a write to a frozen or retired token ledger
    INVALID_STATE = "invalid_state", 422
    INTERNAL = "internal", 500
    UPSTREAM_ERROR = "upstream_error", 502
    STORAGE_UNAVAILABLE = "storage_unavailable", 502
    NOT_READY = "not_ready", 503
    UPSTREAM_UNAVAILABLE = "upstream_unavailable", 503  # a server stayed down past a retry deadline

    @classmethod
    def for_status(cls, status: int) -> ErrorCode:
        """The code of a bare HTTP status (Starlette's own 404, 405, ...): the generic code with
        that status, else ``bad_request`` for a 4xx and ``internal`` for anything else."""
        for code in (cls.BAD_REQUEST, cls.UNAUTHORIZED, cls.FORBIDDEN, cls.NOT_FOUND, cls.METHOD_NOT_ALLOWED):
            if code.status == status:
                return code
        return cls.BAD_REQUEST if status < 500 else cls.INTERNAL


class ApiError(Exception):
    """A refusal with a stable machine-readable code.

    ``code`` is an :class:`ErrorCode` (a plain string is accepted only if it is one: a typo
    fails at once instead of silently becoming a 400). ``status`` overrides the code's own
    status only where a bare HTTP status is translated (Starlette's routing errors).
    """

    def __init__(self, code: ErrorCode | str, message: str, *, status: int | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.code = ErrorCode.of(code)
        self.message = message
        self.status = status if status is not None else self.code.status
        self.details = details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        from starlette.responses import JSONResponse

        return JSONResponse(self.body(), status_code=self.status, headers=headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()
