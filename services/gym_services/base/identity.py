"""Rollout identity: which logical rollout and which attempt a call belongs to (``docs/protocol.md``, "Identity and
fencing").

The identity travels in ``/run`` bodies (``_ng_rollout_id``, or ``_ng_task_index`` +
``_ng_rollout_index``, and ``_ng_attempt_index``) and on every downstream call in the
``x-ng-rollout-id`` / ``x-ng-attempt`` headers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from gym_services.base.errors import ApiError, ErrorCode

ROLLOUT_ID_HEADER = "x-ng-rollout-id"
ATTEMPT_HEADER = "x-ng-attempt"
#: sent by an agent on a call to a server it holds no session cookie of: the episode has no session there
FIRST_SESSION_HEADER = "x-ng-first-session"
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class RolloutIdentity(BaseModel):
    """A rollout id and the attempt (0 for the first dispatch)."""

    model_config = {"frozen": True}

    rollout_id: str = Field(pattern=ROLLOUT_ID_PATTERN.pattern)
    attempt: int = Field(default=0, ge=0)

    @classmethod
    def from_run_body(cls, body: Mapping[str, Any]) -> RolloutIdentity | None:
        """The identity stamped into a ``/run`` body, or ``None`` when it carries none."""
        rollout_id = body.get("_ng_rollout_id")
        if rollout_id is None and "_ng_task_index" in body and "_ng_rollout_index" in body:
            task, rollout = body["_ng_task_index"], body["_ng_rollout_index"]
            if not _is_index(task) or not _is_index(rollout):
                raise ApiError(
                    ErrorCode.BAD_REQUEST, "_ng_task_index and _ng_rollout_index must be non-negative integers"
                )
            rollout_id = f"{task}-{rollout}"
        if rollout_id is None:
            return None
        attempt = body.get("_ng_attempt_index", 0)
        if attempt is None:
            attempt = 0
        return cls._checked(rollout_id, attempt)

    @classmethod
    def require_from_run_body(cls, body: Mapping[str, Any]) -> RolloutIdentity:
        identity = cls.from_run_body(body)
        if identity is None:
            raise ApiError(
                ErrorCode.ROLLOUT_ID_REQUIRED,
                "with checkpointing on, /run needs _ng_rollout_id or _ng_task_index and _ng_rollout_index",
            )
        return identity

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RolloutIdentity | None:
        """The identity of a downstream call, or ``None`` when the caller sent none."""
        rollout_id = headers.get(ROLLOUT_ID_HEADER)
        if rollout_id is None:
            return None
        raw_attempt = headers.get(ATTEMPT_HEADER, "0")
        try:
            attempt = int(raw_attempt)
        except ValueError:
            raise ApiError(ErrorCode.BAD_REQUEST, f"{ATTEMPT_HEADER} must be an integer, got {raw_attempt!r}") from None
        return cls._checked(rollout_id, attempt)

    @classmethod
    def _checked(cls, rollout_id: Any, attempt: Any) -> RolloutIdentity:
        if not isinstance(rollout_id, str) or not ROLLOUT_ID_PATTERN.match(rollout_id):
            raise ApiError(
                ErrorCode.BAD_REQUEST, f"invalid rollout id {rollout_id!r}: must match {ROLLOUT_ID_PATTERN.pattern}"
            )
        if not _is_index(attempt):
            raise ApiError(ErrorCode.BAD_REQUEST, f"invalid attempt {attempt!r}: must be a non-negative integer")
        return cls(rollout_id=rollout_id, attempt=attempt)

    def headers(self) -> dict[str, str]:
        """Headers that carry this identity on a downstream call."""
        return {ROLLOUT_ID_HEADER: self.rollout_id, ATTEMPT_HEADER: str(self.attempt)}

    def next_attempt(self) -> RolloutIdentity:
        return RolloutIdentity(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        """A copy of a ``/run`` body carrying this identity."""
        return {**body, "_ng_rollout_id": self.rollout_id, "_ng_attempt_index": self.attempt}


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
