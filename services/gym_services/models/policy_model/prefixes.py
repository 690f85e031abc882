"""The checkpoint records of one generation (its prompt, its head, its chunks), by rollout id and request digest.

A cut generation is written with what it had reached (``complete: false``); a finished response
that was still held at the capture is written whole (``complete: true``, with its finish reason), so a
restored model answers its re-issue without generating anything. The records keep the generation's
:class:`~gym_services.base.tokens.Tokens` as the engine sampled them: a continuation starts from exactly these
ids, never from re-tokenized text.

A generation is written (after resume, from the :class:`FrozenPrompt`, :class:`FrozenChunk` and :class:`FrozenPrefix`
the capture made) as records split by what changes while the call runs:

- the **prompt record** (key: the head's and ``.prompt``): the call's prompt ids (:mod:`gym_services.base.token_codec`)
  written against ``base``, the rollout's token ledger entry the call continues (its prompt is that call's prompt,
  answer and the new turn), or whole when the model holds no entry of the rollout (its first call: system prompt,
  tool schemas, first message). Its bytes never change while the call runs, so every checkpoint after the first
  references it (the pack writer's reuse by digest);
- **chunks** (key: the head's, ``.g``, the chunk's first token and first character): what the generation wrote
  between two captures, its text and its generated ids and log-probs. A chunk keeps its bytes once written, so a
  checkpoint writes the chunk of what was generated since the previous one, not the generation again (chunks are
  merged only where that rewrites no more than the new chunk's bytes: a long generation has a few chunks);
- the **head** (schema 5; key ``prefix-...``): a JSON header (identity, counts, where the chunks start), rewritten at
  every checkpoint.

``tokens: false``: a generation without the prompt's ids (an engine that never reported them) has no tokens to
continue from: no prompt record, and chunks of text alone.

Still read: schema 4 (one prefix record: the text in its header, the generated ids written against its prompt
record), schema 3 (binary, one record: the header names ``base`` and the prompt is written against it), schema 2
(JSON with ``prompt_token_ids``, ``token_ids``, ``log_probs``) and schema 1 (text only: a complete schema 1 record
answers when no token information is asked for; any other is generated again from the start, its text cannot be
continued token-exactly). See ``docs/protocol.md``, "The prefix record".
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.base import token_codec
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord
from gym_services.models.policy_model import earlier_prefixes

PREFIX_SCHEMA_VERSION = 5
PROMPT_SCHEMA_VERSION = 1
#: a prompt record's key: its prefix record's key and this
PROMPT_SUFFIX = ".prompt"
#: a chunk's key: the head's key, this, its first token's index, ``.`` and its first character's index
CHUNK_INFIX = ".g"
#: the first byte of a chunk (its layout)
CHUNK_LAYOUT = 1
_CHUNK_KEY = re.compile(r"^prefix-[0-9a-f]{64}\.g\d+\.\d+$")
#: a chunk's start: (first generated token, first character of the text)
Start = tuple[int, int]
#: a ledger entry's prompt + generated ids, by rollout id and entry index (what a prompt record is written against)
Bases = Callable[[str, int], "array[int]"]
#: a prefix's rollout id and request digest
Key = tuple[str, str]


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
    #: where its chunks start, ascending, the first (0, 0); empty: one chunk (a record read from schema 1 to 4)
    chunks: tuple[Start, ...] = ()

    def generated(self) -> int:
        """How many generated token ids it holds."""
        return len(self.tokens.generation_token_ids) if self.tokens is not None else 0

    def end(self) -> Start:
        """Where its last chunk ends: its generated ids (none without tokens) and its text's characters."""
        return self.generated(), len(self.text)


#: a chunk this big (about) is never merged again: merging a slow generation's small chunks keeps its records few,
#: and past this size rewriting them costs more than the manifest entries and head places they keep
#: (benchmarks/RESULTS.md, "A generation written in chunks")
SEALED_CHUNK_BYTES = 1024


def _chunk_size(start: Start, end: Start) -> int:
    """About what a chunk from ``start`` to ``end`` takes: 8 bytes a token (its id and log-prob), a byte a character."""
    return 8 * (end[0] - start[0]) + end[1] - start[1]


@dataclass
class ChunkCuts:
    """Where a growing generation's chunks start, and where the last capture left it (``end``); see :meth:`cut`."""

    starts: list[Start] = field(default_factory=list)
    end: Start = (0, 0)
    #: whether the chunks hold token ids (a generation whose prompt ids came late starts over)
    tokens: bool = True

    @classmethod
    def of(cls, staged: StagedPrefix) -> ChunkCuts:
        """A generation continuing ``staged`` keeps its chunks (a restored prefix's are in the checkpoint already)."""
        if not staged.chunks:
            return cls()
        return cls(list(staged.chunks), staged.end(), staged.tokens is not None)

    def cut(self, end: Start, tokens: bool) -> tuple[Start, ...]:
        """The chunks once what was written since the last cut (up to ``end``) is a chunk of its own, merged with
        the trailing chunks no bigger than it (as the ledger's chunks are) unless they are sealed
        (:data:`SEALED_CHUNK_BYTES`): a generation that grows slowly keeps a few small chunks, one that grows fast
        rewrites nothing it wrote. A generation only grows; should it not have, or should its tokens have appeared,
        the chunks start over."""
        if end[0] < self.end[0] or end[1] < self.end[1] or tokens != self.tokens:
            self.starts, self.end, self.tokens = [], (0, 0), tokens
        if end != self.end or not self.starts:
            start = self.end if self.starts else (0, 0)
            size = _chunk_size(start, end)
            while self.starts:
                previous = self.starts[-1]
                previous_size = _chunk_size(previous, start)
                if previous_size > size or previous_size >= SEALED_CHUNK_BYTES:
                    break
                self.starts.pop()
                start, size = previous, size + previous_size
            self.starts.append(start)
            self.end = end
        return tuple(self.starts)


def prefix_record_key(rollout_id: str, digest: str) -> str:
    return "prefix-" + hashlib.sha256(f"{rollout_id}\n{digest}".encode()).hexdigest()


def prompt_record_key(rollout_id: str, digest: str) -> str:
    """The prompt record of the prefix record :func:`prefix_record_key` names."""
    return prefix_record_key(rollout_id, digest) + PROMPT_SUFFIX


def chunk_record_key(rollout_id: str, digest: str, start: Start) -> str:
    return f"{prefix_record_key(rollout_id, digest)}{CHUNK_INFIX}{start[0]}.{start[1]}"


def is_prompt_record(key: str) -> bool:
    return key.endswith(PROMPT_SUFFIX)


def is_chunk_record(key: str) -> bool:
    return _CHUNK_KEY.match(key) is not None


class GenerationHead(BaseModel):
    """Schema 5's JSON header, the whole head record: the generation's text and tokens are in its chunks, which start
    at ``chunks`` (ascending, the first ``[0, 0]``) and end at ``completion_tokens`` and ``text_length``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[5]
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    complete: bool
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int = Field(ge=0)
    text_length: int = Field(ge=0)
    tokens: bool
    chunks: list[tuple[int, int]] = Field(min_length=1)

    def end(self) -> Start:
        """Where the last chunk ends (a prefix without tokens: its chunks hold text alone, their tokens all 0)."""
        return (self.completion_tokens if self.tokens else 0), self.text_length

    @model_validator(mode="after")
    def _checked(self) -> GenerationHead:
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        if self.chunks[0] != (0, 0):
            raise ValueError("the first chunk does not start at [0, 0]")
        ends = [*self.chunks[1:], self.end()]
        for (t0, c0), (t1, c1) in zip(self.chunks, ends, strict=True):
            if t1 < t0 or c1 < c0:
                raise ValueError("chunks that do not follow each other")
        if len(set(self.chunks)) != len(self.chunks):
            raise ValueError("two chunks start at the same place")
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

    #: its bytes stay the same from one checkpoint to the next
    lasting: ClassVar[bool] = True

    @property
    def key(self) -> str:
        return prompt_record_key(self.rollout_id, self.digest)


@dataclass(frozen=True)
class FrozenChunk:
    """One of a frozen prefix's chunks: what it wrote from ``start`` to ``end`` (sliced when encoded)."""

    rollout_id: str
    digest: str
    prefix: StagedPrefix
    start: Start
    end: Start

    lasting: ClassVar[bool] = True

    @property
    def key(self) -> str:
        return chunk_record_key(self.rollout_id, self.digest, self.start)


@dataclass(frozen=True)
class FrozenPrefix:
    """A prefix as the capture froze it: its head (its prompt and chunks go in the records :func:`freeze` makes)."""

    rollout_id: str
    attempt: int
    digest: str
    prefix: StagedPrefix
    #: a head changes at every checkpoint
    lasting: ClassVar[bool] = False

    @property
    def key(self) -> str:
        return prefix_record_key(self.rollout_id, self.digest)


#: one of a generation's frozen records
Frozen = FrozenPrompt | FrozenChunk | FrozenPrefix


def _starts(prefix: StagedPrefix) -> tuple[Start, ...]:
    return prefix.chunks or ((0, 0),)


def freeze(rollout_id: str, digest: str, prefix: StagedPrefix, base: tuple[bytes, ...]) -> list[Frozen]:
    """A generation's records as the capture freezes them: its prompt record (when it has tokens), its chunks, then
    its head; ``base``: its rollout's stored ledger entries (the prompt is written against their last)."""
    records: list[Frozen] = []
    if prefix.tokens is not None:
        records.append(FrozenPrompt(rollout_id, digest, prefix.tokens.prompt_token_ids, base))
    starts = _starts(prefix)
    for start, end in zip(starts, [*starts[1:], prefix.end()], strict=True):
        records.append(FrozenChunk(rollout_id, digest, prefix, start, end))
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


def encode_chunk(state: FrozenChunk) -> bytes:
    """The layout byte, the chunk's first token and first character (varints), its text (a varint length, UTF-8),
    then, for a prefix with tokens, its generated ids and their log-probs as a triple without a prompt."""
    (t0, c0), (t1, c1) = state.start, state.end
    out = bytearray((CHUNK_LAYOUT,))
    token_codec.write_varint(t0, out)
    token_codec.write_varint(c0, out)
    text = state.prefix.text[c0:c1].encode("utf-8", "surrogatepass")
    token_codec.write_varint(len(text), out)
    out += text
    tokens = state.prefix.tokens
    if tokens is not None:
        generated = Tokens((), tokens.generation_token_ids[t0:t1], tokens.generation_log_probs[t0:t1])
        token_codec.encode(generated, (), out)
    return bytes(out)


def encode_head(state: FrozenPrefix) -> bytes:
    """Schema 5: a layout byte, the header's length and JSON (nothing follows)."""
    prefix = state.prefix
    head = GenerationHead(
        schema_version=PREFIX_SCHEMA_VERSION,
        rollout_id=state.rollout_id,
        attempt=state.attempt,
        digest=state.digest,
        complete=prefix.complete,
        finish_reason=prefix.finish_reason,
        prompt_tokens=prefix.prompt_tokens,
        completion_tokens=prefix.completion_tokens,
        text_length=len(prefix.text),
        tokens=prefix.tokens is not None,
        chunks=list(_starts(prefix)),
    )
    return bytes(_header(PREFIX_SCHEMA_VERSION, head))


def encode(state: Frozen) -> bytes:
    """A generation's frozen record, encoded (after resume)."""
    if isinstance(state, FrozenPrompt):
        return encode_prompt(state)
    if isinstance(state, FrozenChunk):
        return encode_chunk(state)
    return encode_head(state)


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


def _prompt(record: RestoredRecord, prefix: RestoredRecord, key: Key, bases: Bases) -> array[int]:
    """The prompt a prefix's tokens continue (schema 4 and 5), read from its prompt record."""
    if (record.rollout_id, record.attempt) != (prefix.rollout_id, prefix.attempt):
        raise InvalidState(f"record {record.key}: manifest identity does not match its prefix record's")
    prompt, triple = read_prompt(record)
    if (prompt.rollout_id, prompt.digest) != key:
        raise InvalidState(f"record {record.key} does not hold the prompt its key names")
    try:
        return triple.prompt(_base(record, prompt.rollout_id, prompt.base, bases))
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a prompt record: {exc}") from None


def _prompt_of(record: RestoredRecord, key: Key, bases: Bases, prompts: dict[str, RestoredRecord]) -> array[int]:
    prompt = prompts.pop(record.key + PROMPT_SUFFIX, None)
    if prompt is None:
        raise InvalidState(f"record {record.key}: its prompt record {record.key}{PROMPT_SUFFIX} is missing")
    return _prompt(prompt, record, key, bases)


@dataclass
class Chunks:
    """A checkpoint's chunks by key; each is taken out by the head that lists it (one left over is refused)."""

    by_key: dict[str, RestoredRecord] = field(default_factory=dict)

    def read(self, head_record: RestoredRecord, head: GenerationHead) -> tuple[str, Tokens | None]:
        """The text and the generated ids and log-probs (empty prompt) the head's chunks hold, in order, each checked
        to start where the head says and the one before ended."""
        texts: list[str] = []
        characters = 0
        generated: list[int] = []
        log_probs: list[float] = []
        for start in head.chunks:
            key = f"{head_record.key}{CHUNK_INFIX}{start[0]}.{start[1]}"
            record = self.by_key.pop(key, None)
            if record is None:
                raise InvalidState(f"record {head_record.key}: its chunk {key} is missing")
            if (record.rollout_id, record.attempt) != (head_record.rollout_id, head_record.attempt):
                raise InvalidState(f"record {key}: manifest identity does not match its head's")
            if start != (len(generated) if head.tokens else 0, characters):
                raise InvalidState(f"record {key} does not start where the chunk before it ended")
            try:
                text, triple = _read_chunk(record, start, head.tokens)
            except token_codec.TokenCodecError as exc:
                raise InvalidState(f"record {key} is not a chunk: {exc}") from None
            texts.append(text)
            characters += len(text)
            if triple is not None:
                generated.extend(triple.generated)
                log_probs.extend(triple.log_probs)
        text = "".join(texts)
        if (len(generated) if head.tokens else 0, len(text)) != head.end():
            raise InvalidState(
                f"record {head_record.key}: its chunks hold {len(generated)} token ids and {len(text)} characters, "
                f"not {head.completion_tokens} and {head.text_length}"
            )
        return text, (Tokens((), tuple(generated), tuple(log_probs)) if head.tokens else None)

    def left_over(self) -> None:
        if self.by_key:
            orphan = min(self.by_key)
            raise InvalidState(f"record {orphan} is a chunk that no prefix record lists")


def _read_chunk(record: RestoredRecord, start: Start, tokens: bool) -> tuple[str, token_codec.Decoded | None]:
    data = memoryview(record.data)
    if data[:1] != bytes((CHUNK_LAYOUT,)):
        raise token_codec.TokenCodecError(f"its layout byte is not {CHUNK_LAYOUT}")
    t0, offset = token_codec.read_varint(data, 1)
    c0, offset = token_codec.read_varint(data, offset)
    if (t0, c0) != start:
        raise token_codec.TokenCodecError(f"it starts at {[t0, c0]}, its key says {list(start)}")
    size, offset = token_codec.read_varint(data, offset)
    if offset + size > len(data):
        raise token_codec.TokenCodecError("its text is truncated")
    try:
        text = bytes(data[offset : offset + size]).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise token_codec.TokenCodecError(f"its text is not UTF-8 ({exc.reason})") from None
    offset += size
    triple = None
    if tokens:
        triple, offset = token_codec.decode(data, offset)
        if len(triple.fresh) or triple.shared:
            raise token_codec.TokenCodecError("a chunk holds prompt ids")
    if offset != len(data):
        raise token_codec.TokenCodecError("bytes after the chunk")
    return text, triple


def _from_head(
    record: RestoredRecord,
    data: memoryview,
    offset: int,
    size: int,
    bases: Bases,
    prompts: dict[str, RestoredRecord],
    chunks: Chunks,
) -> tuple[Key, StagedPrefix]:
    """Schema 5: the head, its prompt record and its chunks."""
    try:
        head = GenerationHead.model_validate_json(bytes(data[offset : offset + size]))
    except ValidationError as exc:
        raise InvalidState(f"record {record.key} is not a prefix record: {_problems(exc)}") from None
    if offset + size != len(data):
        raise InvalidState(f"record {record.key} is not a prefix record: bytes after the header")
    key = _checked(record, head.rollout_id, head.attempt, head.digest)
    text, generated = chunks.read(record, head)
    tokens = None
    if generated is not None:
        prompt = _prompt_of(record, key, bases, prompts)
        tokens = Tokens(TokenArray(prompt), generated.generation_token_ids, generated.generation_log_probs)
    staged = StagedPrefix(
        head.attempt + 1,
        text,
        head.complete,
        head.finish_reason,
        head.prompt_tokens,
        head.completion_tokens,
        tokens,
        tuple(head.chunks),
    )
    return key, staged


def _from_binary(record: RestoredRecord, bases: Bases, prompts: dict[str, RestoredRecord]) -> tuple[Key, StagedPrefix]:
    """Schema 3 and 4 (read only, ``earlier_prefixes``)."""
    try:
        head, triple = earlier_prefixes.read_binary(record.data)
        tokens = None
        if triple is not None:
            if head.schema_version == 3:
                base = _base(record, head.rollout_id, head.base, bases)
            else:
                base = _prompt_of(record, (head.rollout_id, head.digest), bases, prompts)
            tokens = triple.tokens(base)
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
    return _checked(record, head.rollout_id, head.attempt, head.digest), staged


def _from_json(record: RestoredRecord) -> tuple[Key, StagedPrefix]:
    """Schema 1 and 2 (read only, ``earlier_prefixes``)."""
    try:
        payload = earlier_prefixes.PrefixRecord.model_validate(json.loads(record.data))
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
    record: RestoredRecord,
    bases: Bases,
    prompts: dict[str, RestoredRecord] | None = None,
    chunks: Chunks | None = None,
) -> tuple[Key, StagedPrefix]:
    """Parse and check one prefix record (a schema 5 head, or a record of schema 1 to 4); the prefix is staged for
    ``attempt + 1``. ``prompts``: the checkpoint's prompt records by key, ``chunks`` its chunks (a head's are taken
    out of them); ``bases`` gives the ledger entries a prompt record (or a schema 3 prefix record) is written
    against."""
    prompts = {} if prompts is None else prompts
    if record.data[:1] == bytes((PREFIX_SCHEMA_VERSION,)):
        data = memoryview(record.data)
        try:
            size, offset = token_codec.read_varint(data, 1)
        except token_codec.TokenCodecError as exc:
            raise InvalidState(f"record {record.key} is not a prefix record: {exc}") from None
        return _from_head(record, data, offset, size, bases, prompts, Chunks() if chunks is None else chunks)
    if record.data[:1] and record.data[0] in earlier_prefixes.BINARY_SCHEMA_VERSIONS:
        return _from_binary(record, bases, prompts)
    return _from_json(record)


def read_records(records: list[RestoredRecord], bases: Bases) -> dict[Key, StagedPrefix]:
    """Every prefix of a checkpoint's records (heads or prefix records, prompt records, chunks), each staged for
    attempt + 1; raises InvalidState at the first bad record, a prefix whose prompt record or chunk is missing, or a
    prompt record or chunk no prefix uses."""
    prompts = {r.key: r for r in records if is_prompt_record(r.key)}
    chunks = Chunks({r.key: r for r in records if is_chunk_record(r.key)})
    staged: dict[Key, StagedPrefix] = {}
    for record in records:
        if not is_prompt_record(record.key) and not is_chunk_record(record.key):
            key, prefix = from_record(record, bases, prompts, chunks)
            staged[key] = prefix
    if prompts:
        orphan = min(prompts)
        raise InvalidState(
            f"record {orphan} holds a prompt that no prefix record uses (its prefix record "
            f"{orphan.removesuffix(PROMPT_SUFFIX)} is missing or holds no tokens written against it)"
        )
    chunks.left_over()
    return staged


def _checked(record: RestoredRecord, rollout_id: str, attempt: int, digest: str) -> Key:
    if record.key != prefix_record_key(rollout_id, digest):
        raise InvalidState(f"record {record.key} does not hold the prefix its key names")
    if record.rollout_id != rollout_id or record.attempt != attempt:
        raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
    return rollout_id, digest
