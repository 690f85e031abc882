"""The checkpoint record of one generation: its prefix, keyed by rollout id and request digest.

A cut generation is written with what it had reached (``complete: false``); a finished response
that was still held at the capture is written whole (``complete: true``, with its finish reason), so a
restored model answers its re-issue without generating anything. The record keeps the generation's
:class:`~gym_services.base.tokens.Tokens` as the engine sampled them: a continuation starts from exactly these
ids, never from re-tokenized text.

Schema 3 (written now, after resume: :class:`FrozenPrefix`) is binary: a JSON header (identity, text, counts,
``base``) and the tokens (:mod:`gym_services.base.token_codec`) written against ``base``, the rollout's token
ledger entry the generation continues (its prompt is that call's prompt, answer and the new turn), so a cut
generation costs its new turn and what it generated, not its whole context again. A policy model that does not
record tokens has no ledger to write against: the prompt is written whole (4 bytes per id). ``tokens: false``: a
prefix without the prompt's ids (an engine that never reported them) has no tokens to continue from.

Schema 2 (JSON with ``prompt_token_ids``, ``token_ids``, ``log_probs``) and schema 1 (text only) are still read:
a complete schema 1 record answers when no token information is asked for; any other is generated again from the
start (its text cannot be continued token-exactly). See ``docs/protocol.md``, "The prefix record".
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.base import token_codec
from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord

PREFIX_SCHEMA_VERSION = 3
#: schema versions of the JSON records this reader accepts (1: text only, 2: token ids as JSON)
READABLE_SCHEMA_VERSIONS = (1, 2)
#: a ledger entry's prompt + generated ids, by rollout id and entry index (what a schema 3 record is written against)
Bases = Callable[[str, int], "array[int]"]


class PrefixRecord(BaseModel):
    """The JSON format of schema 1 and 2 (read only)."""

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


class PrefixHead(BaseModel):
    """Schema 3's JSON header; the tokens follow it (written against ledger entry ``base``, or against nothing)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[3]
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    text: str
    complete: bool
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int = Field(ge=0)
    tokens: bool
    base: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _complete_has_reason(self) -> PrefixHead:
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        if self.base is not None and not self.tokens:
            raise ValueError("a record without tokens is written against no ledger entry")
        return self


@dataclass(frozen=True)
class FrozenPrefix:
    """A prefix as the capture froze it, with the stored ledger entries of its rollout up to the one its tokens
    are written against (``base``: their last; none when the model records no ledger for the rollout)."""

    rollout_id: str
    attempt: int
    digest: str
    prefix: StagedPrefix
    base: tuple[bytes, ...] = ()

    @property
    def key(self) -> str:
        return prefix_record_key(self.rollout_id, self.digest)


def encode_prefix(frozen: FrozenPrefix) -> bytes:
    """Schema 3: a layout byte, the header's length and JSON, then the tokens."""
    prefix, tokens = frozen.prefix, frozen.prefix.tokens
    base = token_codec.last_sequence(token_codec.entry_sequences(frozen.base)) if tokens is not None else array("I")
    head = (
        PrefixHead(
            schema_version=PREFIX_SCHEMA_VERSION,
            rollout_id=frozen.rollout_id,
            attempt=frozen.attempt,
            digest=frozen.digest,
            text=prefix.text,
            complete=prefix.complete,
            finish_reason=prefix.finish_reason,
            prompt_tokens=prefix.prompt_tokens,
            completion_tokens=prefix.completion_tokens,
            tokens=tokens is not None,
            base=len(frozen.base) - 1 if tokens is not None and frozen.base else None,
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )
    out = bytearray((PREFIX_SCHEMA_VERSION,))
    token_codec.write_varint(len(head), out)
    out += head
    if tokens is not None:
        token_codec.encode(tokens, base, out)
    return bytes(out)


def _staged(
    attempt: int,
    text: str,
    complete: bool,
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int,
    tokens: Tokens | None,
) -> StagedPrefix:
    """The prefix staged for ``attempt + 1``."""
    return StagedPrefix(attempt + 1, text, complete, finish_reason, prompt_tokens, completion_tokens, tokens)


def _from_binary(record: RestoredRecord, bases: Bases) -> tuple[PrefixHead, StagedPrefix]:
    data = memoryview(record.data)
    try:
        size, offset = token_codec.read_varint(data, 1)
        head = PrefixHead.model_validate_json(bytes(data[offset : offset + size]))
        tokens = None
        if head.tokens:
            triple, end = token_codec.decode(data, offset + size)
            if end != len(data):
                raise token_codec.TokenCodecError("bytes after the tokens")
            try:
                base = bases(head.rollout_id, head.base) if head.base is not None else array("I")
            except (KeyError, IndexError):
                raise InvalidState(
                    f"record {record.key} continues ledger entry {head.base} of {head.rollout_id!r}, which the "
                    "checkpoint does not hold"
                ) from None
            tokens = triple.tokens(base)
        elif offset + size != len(data):
            raise token_codec.TokenCodecError("bytes after the header")
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a prefix record: {problems}") from None
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a prefix record: {exc}") from None
    if tokens is not None and len(tokens.generation_token_ids) != head.completion_tokens:
        raise InvalidState(
            f"record {record.key}: completion_tokens {head.completion_tokens} but "
            f"{len(tokens.generation_token_ids)} token ids"
        )
    staged = _staged(
        head.attempt, head.text, head.complete, head.finish_reason, head.prompt_tokens, head.completion_tokens, tokens
    )
    return head, staged


def from_record(record: RestoredRecord, bases: Bases) -> tuple[tuple[str, str], StagedPrefix]:
    """Parse and check one record (``bases`` gives the ledger entries schema 3 records are written against); the
    prefix is staged for ``attempt + 1``."""
    if record.data[:1] == bytes((PREFIX_SCHEMA_VERSION,)):
        head, staged = _from_binary(record, bases)
        return _checked(record, head.rollout_id, head.attempt, head.digest), staged
    try:
        payload = PrefixRecord.model_validate(json.loads(record.data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"record {record.key} is not JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a prefix record: {problems}") from None
    staged = _staged(
        payload.attempt,
        payload.text,
        payload.complete,
        payload.finish_reason,
        payload.prompt_tokens,
        payload.completion_tokens,
        payload.tokens(),
    )
    return _checked(record, payload.rollout_id, payload.attempt, payload.digest), staged


def _checked(record: RestoredRecord, rollout_id: str, attempt: int, digest: str) -> tuple[str, str]:
    if record.key != prefix_record_key(rollout_id, digest):
        raise InvalidState(f"record {record.key} does not hold the prefix its key names")
    if record.rollout_id != rollout_id or record.attempt != attempt:
        raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
    return rollout_id, digest
