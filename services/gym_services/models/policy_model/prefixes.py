"""The checkpoint record of one generation: its prefix, keyed by rollout id and request digest.

A cut generation is written with what it had reached (``complete: false``); a finished response
that was still held at the capture is written whole (``complete: true``, with its finish reason), so a
restored model answers its re-issue without generating anything. Schema 2 keeps the generation's
:class:`~gym_services.base.tokens.Tokens` as the engine sampled them, under the record's own field names
(``prompt_token_ids``, ``token_ids``, ``log_probs``: the stored format, read into a ``Tokens`` here and
nowhere else): a continuation starts from exactly these ids, never from re-tokenized text. Schema 1
records (text only, written before) are still read: a complete one answers when no token
information is asked for; anything else is generated again from the start (its text cannot be
continued token-exactly). A prefix without the prompt's ids (an engine that never reported them) has
no tokens to continue from and is written as schema 1. See ``docs/protocol.md``, "The prefix record".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, Record, RestoredRecord

PREFIX_SCHEMA_VERSION = 2
#: schema versions this reader accepts (1: text only)
READABLE_SCHEMA_VERSIONS = (1, 2)


class PrefixRecord(BaseModel):
    """The stored format (schema 1 and 2)."""

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
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    log_probs: list[float] | None = None

    @model_validator(mode="after")
    def _complete_has_reason(self) -> PrefixRecord:
        if self.schema_version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (want one of {READABLE_SCHEMA_VERSIONS})"
            )
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        if self.schema_version == 1:
            if self.token_ids is not None or self.log_probs is not None or self.prompt_token_ids is not None:
                raise ValueError("a schema 1 record holds no token ids")
            return self
        if self.token_ids is None or self.log_probs is None:
            raise ValueError("a schema 2 record needs token_ids and log_probs")
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.token_ids)} token_ids but {len(self.log_probs)} log_probs")
        if len(self.token_ids) != self.completion_tokens:
            raise ValueError(f"completion_tokens {self.completion_tokens} but {len(self.token_ids)} token_ids")
        if self.token_ids and self.prompt_token_ids is None:
            raise ValueError("generated token ids need the prompt's token ids to be continued")
        return self

    def tokens(self) -> Tokens | None:
        """The record's tokens; None for a text-only one (schema 1, or schema 2 without the prompt's ids)."""
        if self.token_ids is None or self.log_probs is None or self.prompt_token_ids is None:
            return None
        return Tokens.of(self.prompt_token_ids, self.token_ids, self.log_probs)


@dataclass(frozen=True)
class StagedPrefix:
    """A prefix waiting for its generation to be re-issued by ``attempt`` (or a later one); used once."""

    attempt: int
    text: str
    complete: bool
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int
    #: None: text only (a schema 1 record, or a prefix whose prompt ids the engine never reported): nothing to
    #: continue token-exactly
    tokens: Tokens | None = None

    def generated(self) -> int:
        """How many generated token ids it holds."""
        return len(self.tokens.generation_token_ids) if self.tokens is not None else 0


def prefix_record_key(rollout_id: str, digest: str) -> str:
    return "prefix-" + hashlib.sha256(f"{rollout_id}\n{digest}".encode()).hexdigest()


def to_record(rollout_id: str, attempt: int, digest: str, staged: StagedPrefix) -> Record:
    tokens = staged.tokens  # None: text only; a schema 1 record staged and kept again stays what it was
    payload = PrefixRecord(
        schema_version=1 if tokens is None else PREFIX_SCHEMA_VERSION,
        rollout_id=rollout_id,
        attempt=attempt,
        digest=digest,
        text=staged.text,
        complete=staged.complete,
        finish_reason=staged.finish_reason,
        prompt_tokens=staged.prompt_tokens,
        completion_tokens=staged.completion_tokens,
        prompt_token_ids=None if tokens is None else list(tokens.prompt_token_ids),
        token_ids=None if tokens is None else list(tokens.generation_token_ids),
        log_probs=None if tokens is None else list(tokens.generation_log_probs),
    )
    data = json.dumps(payload.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")).encode()
    return Record(key=prefix_record_key(rollout_id, digest), data=data, rollout_id=rollout_id, attempt=attempt)


def from_record(record: RestoredRecord) -> tuple[tuple[str, str], StagedPrefix]:
    """Parse and check one record; the prefix is staged for ``attempt + 1``."""
    try:
        payload = PrefixRecord.model_validate(json.loads(record.data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"record {record.key} is not JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a prefix record: {problems}") from None
    if record.key != prefix_record_key(payload.rollout_id, payload.digest):
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
        tokens=payload.tokens(),
    )
    return (payload.rollout_id, payload.digest), staged
