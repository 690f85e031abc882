"""The checkpoint record of one generation: its prefix, keyed by rollout id and request digest.

A cut generation is written with the text it had reached (``complete: false``); a finished response
that was still held at the capture is written whole (``complete: true``, with its finish reason), so a
restored model answers its re-issue without generating anything. Token counts travel with the text,
so the re-issued call reports the same ``usage`` as the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.control.participant import InvalidState, Record, RestoredRecord

PREFIX_SCHEMA_VERSION = 1


class PrefixRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    text: str
    complete: bool
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _complete_has_reason(self) -> PrefixRecord:
        if self.schema_version != PREFIX_SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not supported (want {PREFIX_SCHEMA_VERSION})")
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        return self


@dataclass(frozen=True)
class StagedPrefix:
    """A prefix waiting for its generation to be re-issued by ``attempt`` (or a later one); used once."""

    attempt: int
    text: str
    complete: bool
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int


def record_key(rollout_id: str, digest: str) -> str:
    return "prefix-" + hashlib.sha256(f"{rollout_id}\n{digest}".encode()).hexdigest()


def to_record(rollout_id: str, attempt: int, digest: str, staged: StagedPrefix) -> Record:
    payload = PrefixRecord(
        schema_version=PREFIX_SCHEMA_VERSION,
        rollout_id=rollout_id,
        attempt=attempt,
        digest=digest,
        text=staged.text,
        complete=staged.complete,
        finish_reason=staged.finish_reason,
        prompt_tokens=staged.prompt_tokens,
        completion_tokens=staged.completion_tokens,
    )
    data = json.dumps(payload.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")).encode()
    return Record(key=record_key(rollout_id, digest), data=data, rollout_id=rollout_id, attempt=attempt)


def from_record(record: RestoredRecord) -> tuple[tuple[str, str], StagedPrefix]:
    """Parse and check one record; the prefix is staged for ``attempt + 1``."""
    try:
        payload = PrefixRecord.model_validate(json.loads(record.data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"record {record.key} is not JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a prefix record: {problems}") from None
    if record.key != record_key(payload.rollout_id, payload.digest):
        raise InvalidState(f"record {record.key} does not hold the prefix its key names")
    if record.rollout_id != payload.rollout_id or record.attempt != payload.attempt:
        raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
    staged = StagedPrefix(
        attempt=payload.attempt + 1,
        text=payload.text,
        complete=payload.complete,
        finish_reason=payload.finish_reason,
        prompt_tokens=payload.prompt_tokens,
        completion_tokens=payload.completion_tokens,
    )
    return (payload.rollout_id, payload.digest), staged
