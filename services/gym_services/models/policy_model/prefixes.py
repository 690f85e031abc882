"""The checkpoint records of one generation: its prefix and its prompt, keyed by rollout id and request digest.

A cut generation is written with what it had reached (``complete: false``); a finished response
that was still held at the capture is written whole (``complete: true``, with its finish reason), so a
restored model answers its re-issue without generating anything. The records keep the generation's
:class:`~gym_services.base.tokens.Tokens` as the engine sampled them: a continuation starts from exactly these
ids, never from re-tokenized text.

A generation with tokens is two records (written after resume from :class:`FrozenPrompt` and :class:`FrozenPrefix`),
split by what changes while the call runs:

- the **prompt record** (key: the prefix record's and ``.prompt``): the call's prompt ids
  (:mod:`gym_services.base.token_codec`) written against ``base``, the rollout's token ledger entry the call
  continues (its prompt is that call's prompt, answer and the new turn), or whole when the model holds no entry of
  the rollout (its first call: system prompt, tool schemas, first message). Its bytes never change while the call
  runs, so every checkpoint after the first references it (the pack writer's reuse by digest);
- the **prefix record** (schema 4): a JSON header (identity, text, counts) and the tokens written against the prompt
  record's prompt: the prompt costs a varint, the record what the generation generated and the log-probs.

``tokens: false``: a prefix without the prompt's ids (an engine that never reported them) has no tokens to continue
from, and no prompt record.

Still read: schema 3 (binary, one record: the header names ``base`` and the prompt is written against it), schema 2
(JSON with ``prompt_token_ids``, ``token_ids``, ``log_probs``) and schema 1 (text only: a complete schema 1 record
answers when no token information is asked for; any other is generated again from the start, its text cannot be
continued token-exactly). See ``docs/protocol.md``, "The prefix record".
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.base import token_codec
from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord

PREFIX_SCHEMA_VERSION = 4
#: the binary prefix schemas this reader accepts (3: one record, its prompt written against a ledger entry)
BINARY_SCHEMA_VERSIONS = (3, PREFIX_SCHEMA_VERSION)
#: schema versions of the JSON records this reader accepts (1: text only, 2: token ids as JSON)
READABLE_SCHEMA_VERSIONS = (1, 2)
PROMPT_SCHEMA_VERSION = 1
#: a prompt record's key: its prefix record's key and this
PROMPT_SUFFIX = ".prompt"
#: a ledger entry's prompt + generated ids, by rollout id and entry index (what a prompt record is written against)
Bases = Callable[[str, int], "array[int]"]
#: a prefix's rollout id and request digest
Key = tuple[str, str]


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


def prompt_record_key(rollout_id: str, digest: str) -> str:
    """The prompt record of the prefix record :func:`prefix_record_key` names."""
    return prefix_record_key(rollout_id, digest) + PROMPT_SUFFIX


def is_prompt_record(key: str) -> bool:
    return key.endswith(PROMPT_SUFFIX)


class PrefixHead(BaseModel):
    """The binary schemas' JSON header; the tokens follow it. Schema 4: written against the prompt record's prompt.
    Schema 3 (read only): written against ledger entry ``base``, or against nothing."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[3, 4]
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
        if self.base is not None and (not self.tokens or self.schema_version != 3):
            raise ValueError("only a schema 3 record with tokens is written against a ledger entry")
        return self


class PromptHead(BaseModel):
    """A prompt record's JSON header; the prompt's ids follow it, written against ledger entry ``base`` (absent: the
    rollout had no entry, the prompt is written whole)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    rollout_id: str = Field(min_length=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    base: int | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class FrozenPrompt:
    """A generation's prompt as the capture froze it, with the stored ledger entries of its rollout up to the one it
    is written against (``base``: their last; none when the model holds no entry of the rollout)."""

    rollout_id: str
    digest: str
    prompt: Sequence[int]
    base: tuple[bytes, ...] = ()

    @property
    def key(self) -> str:
        return prompt_record_key(self.rollout_id, self.digest)


@dataclass(frozen=True)
class FrozenPrefix:
    """A prefix as the capture froze it (its prompt goes in the :class:`FrozenPrompt` :func:`freeze` makes)."""

    rollout_id: str
    attempt: int
    digest: str
    prefix: StagedPrefix

    @property
    def key(self) -> str:
        return prefix_record_key(self.rollout_id, self.digest)


#: one of a generation's frozen records
Frozen = FrozenPrompt | FrozenPrefix


def freeze(rollout_id: str, digest: str, prefix: StagedPrefix, base: tuple[bytes, ...]) -> list[Frozen]:
    """A generation's records as the capture freezes them: its prompt record (when it has tokens), then its prefix
    record; ``base``: its rollout's stored ledger entries (the prompt is written against their last)."""
    records: list[Frozen] = []
    if prefix.tokens is not None:
        records.append(FrozenPrompt(rollout_id, digest, prefix.tokens.prompt_token_ids, base))
    records.append(FrozenPrefix(rollout_id, prefix.attempt, digest, prefix))
    return records


def _header(version: int, head: BaseModel) -> bytearray:
    data = head.model_dump_json(exclude_none=True).encode()
    out = bytearray((version,))
    token_codec.write_varint(len(data), out)
    out += data
    return out


def encode_prompt(state: FrozenPrompt) -> bytes:
    """A layout byte (the prompt schema), the header's length and JSON, then the prompt as a triple without
    generated ids, written against the base."""
    base = token_codec.last_sequence(token_codec.entry_sequences(state.base))
    head = PromptHead(
        schema_version=PROMPT_SCHEMA_VERSION,
        rollout_id=state.rollout_id,
        digest=state.digest,
        base=len(state.base) - 1 if state.base else None,
    )
    out = _header(PROMPT_SCHEMA_VERSION, head)
    token_codec.encode(Tokens(state.prompt), base, out)
    return bytes(out)


def encode_prefix(state: FrozenPrefix) -> bytes:
    """Schema 4: a layout byte, the header's length and JSON, then the tokens written against their own prompt (what
    the prompt record holds): the prompt is its length, a varint."""
    prefix, tokens = state.prefix, state.prefix.tokens
    head = PrefixHead(
        schema_version=PREFIX_SCHEMA_VERSION,
        rollout_id=state.rollout_id,
        attempt=state.attempt,
        digest=state.digest,
        text=prefix.text,
        complete=prefix.complete,
        finish_reason=prefix.finish_reason,
        prompt_tokens=prefix.prompt_tokens,
        completion_tokens=prefix.completion_tokens,
        tokens=tokens is not None,
    )
    out = _header(PREFIX_SCHEMA_VERSION, head)
    if tokens is not None:
        prompt = token_codec.ids_array(tokens.prompt_token_ids)
        token_codec.encode(Tokens(prompt, tokens.generation_token_ids, tokens.generation_log_probs), prompt, out)
    return bytes(out)


def encode(state: Frozen) -> bytes:
    """A generation's frozen record, encoded (after resume)."""
    return encode_prompt(state) if isinstance(state, FrozenPrompt) else encode_prefix(state)


# --- restore ---------------------------------------------------------------------------


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])


def _base(record: RestoredRecord, rollout_id: str, index: int | None, bases: Bases) -> array[int]:
    if index is None:
        return array("I")
    try:
        return bases(rollout_id, index)
    except (KeyError, IndexError):
        raise InvalidState(
            f"record {record.key} continues ledger entry {index} of {rollout_id!r}, which the checkpoint does not hold"
        ) from None


def read_prompt(record: RestoredRecord) -> tuple[PromptHead, token_codec.Decoded]:
    """A prompt record's header and its prompt (a triple without generated ids, written against the header's
    ``base``); raises InvalidState when the bytes are not one."""
    data = memoryview(record.data)
    try:
        if data[:1] != bytes((PROMPT_SCHEMA_VERSION,)):
            raise token_codec.TokenCodecError(f"its layout byte is not {PROMPT_SCHEMA_VERSION}")
        size, offset = token_codec.read_varint(data, 1)
        prompt = PromptHead.model_validate_json(bytes(data[offset : offset + size]))
        triple, end = token_codec.decode(data, offset + size)
        if end != len(data) or len(triple.generated):
            raise token_codec.TokenCodecError("bytes after the prompt")
    except ValidationError as exc:
        raise InvalidState(f"record {record.key} is not a prompt record: {_problems(exc)}") from None
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a prompt record: {exc}") from None
    return prompt, triple


def _prompt(record: RestoredRecord, prefix: RestoredRecord, head: PrefixHead, bases: Bases) -> array[int]:
    """The prompt a schema 4 prefix record's tokens are written against, read from its prompt record."""
    if (record.rollout_id, record.attempt) != (prefix.rollout_id, prefix.attempt):
        raise InvalidState(f"record {record.key}: manifest identity does not match its prefix record's")
    prompt, triple = read_prompt(record)
    if (prompt.rollout_id, prompt.digest) != (head.rollout_id, head.digest):
        raise InvalidState(f"record {record.key} does not hold the prompt its key names")
    try:
        return triple.prompt(_base(record, prompt.rollout_id, prompt.base, bases))
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a prompt record: {exc}") from None


def _from_binary(
    record: RestoredRecord, bases: Bases, prompts: dict[str, RestoredRecord]
) -> tuple[PrefixHead, StagedPrefix]:
    data = memoryview(record.data)
    try:
        size, offset = token_codec.read_varint(data, 1)
        head = PrefixHead.model_validate_json(bytes(data[offset : offset + size]))
        if head.schema_version != data[0]:
            raise token_codec.TokenCodecError(f"layout {data[0]} but schema_version {head.schema_version}")
        tokens = None
        if head.tokens:
            triple, end = token_codec.decode(data, offset + size)
            if end != len(data):
                raise token_codec.TokenCodecError("bytes after the tokens")
            if head.schema_version == 3:
                base = _base(record, head.rollout_id, head.base, bases)
            else:
                prompt = prompts.pop(record.key + PROMPT_SUFFIX, None)
                if prompt is None:
                    raise InvalidState(f"record {record.key}: its prompt record {record.key}{PROMPT_SUFFIX} is missing")
                base = _prompt(prompt, record, head, bases)
            tokens = triple.tokens(base)
        elif offset + size != len(data):
            raise token_codec.TokenCodecError("bytes after the header")
    except ValidationError as exc:
        raise InvalidState(f"record {record.key} is not a prefix record: {_problems(exc)}") from None
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a prefix record: {exc}") from None
    if tokens is not None and len(tokens.generation_token_ids) != head.completion_tokens:
        raise InvalidState(
            f"record {record.key}: completion_tokens {head.completion_tokens} but "
            f"{len(tokens.generation_token_ids)} token ids"
        )
    staged = StagedPrefix(
        head.attempt + 1,
        head.text,
        head.complete,
        head.finish_reason,
        head.prompt_tokens,
        head.completion_tokens,
        tokens,
    )
    return head, staged


def _from_json(record: RestoredRecord) -> tuple[Key, StagedPrefix]:
    try:
        payload = PrefixRecord.model_validate(json.loads(record.data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"record {record.key} is not JSON: {exc}") from None
    except ValidationError as exc:
        raise InvalidState(f"record {record.key} is not a prefix record: {_problems(exc)}") from None
    staged = StagedPrefix(
        payload.attempt + 1,
        payload.text,
        payload.complete,
        payload.finish_reason,
        payload.prompt_tokens,
        payload.completion_tokens,
        payload.tokens(),
    )
    return _checked(record, payload.rollout_id, payload.attempt, payload.digest), staged


def from_record(
    record: RestoredRecord, bases: Bases, prompts: dict[str, RestoredRecord] | None = None
) -> tuple[Key, StagedPrefix]:
    """Parse and check one prefix record; the prefix is staged for ``attempt + 1``. ``prompts``: the checkpoint's
    prompt records by key (a schema 4 record's is taken out of it); ``bases`` gives the ledger entries a prompt
    record (or a schema 3 prefix record) is written against."""
    if record.data[:1] and record.data[0] in BINARY_SCHEMA_VERSIONS:
        head, staged = _from_binary(record, bases, {} if prompts is None else prompts)
        return _checked(record, head.rollout_id, head.attempt, head.digest), staged
    return _from_json(record)


def read_records(records: list[RestoredRecord], bases: Bases) -> dict[Key, StagedPrefix]:
    """Every prefix of a checkpoint's records (prefix and prompt records), each staged for attempt + 1; raises
    InvalidState at the first bad record, a prefix record whose prompt record is missing, or a prompt record no prefix
    record uses."""
    prompts = {r.key: r for r in records if is_prompt_record(r.key)}
    staged: dict[Key, StagedPrefix] = {}
    for record in records:
        if not is_prompt_record(record.key):
            key, prefix = from_record(record, bases, prompts)
            staged[key] = prefix
    if prompts:
        orphan = min(prompts)
        raise InvalidState(
            f"record {orphan} holds a prompt that no prefix record uses (its prefix record "
            f"{orphan.removesuffix(PROMPT_SUFFIX)} is missing or holds no tokens written against it)"
        )
    return staged


def _checked(record: RestoredRecord, rollout_id: str, attempt: int, digest: str) -> Key:
    if record.key != prefix_record_key(rollout_id, digest):
        raise InvalidState(f"record {record.key} does not hold the prefix its key names")
    if record.rollout_id != rollout_id or record.attempt != attempt:
        raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
    return rollout_id, digest
