"""JSON errors in the one form every server uses (DESIGN §4).

Every refusal is an :class:`ApiError`; the app factory turns it into
``{"error": {"code": ..., "message": ...}}`` with the matching status, so
callers can branch on ``code`` instead of parsing prose.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

#: code -> HTTP status, the codes used across the stack.
ERROR_STATUS: dict[str, int] = {
    "bad_request": 400,
    "rollout_id_required": 400,
    "unauthorized": 401,
    "not_found": 404,
    "session_not_found": 404,
    "unknown_checkpoint": 404,
    "method_not_allowed": 405,
    "stale_attempt": 409,
    "checkpoint_parked": 409,
    "checkpoint_busy": 409,
    "invalid_phase": 409,
    "invalid_state": 422,
    "internal": 500,
    "upstream_error": 502,
    "not_ready": 503,
}


class ApiError(Exception):
    """A refusal with a stable machine-readable code."""

    def __init__(self, code: str, message: str, *, status: int | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else ERROR_STATUS.get(code, 400)
        self.details = details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_response(code: str, message: str, *, status: int | None = None, details: Any = None) -> JSONResponse:
    return ApiError(code, message, status=status, details=details).response()


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()
