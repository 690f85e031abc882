"""The token ledger in a checkpoint: a head and append-only chunks per rollout (``docs/protocol.md``, "The token
ledger"; ``docs/decisions.md``, "Tokens are stored once, in binary, as the delta of each call").

A rollout's **head** (:class:`LedgerHead`, JSON: attempt, version, intents, lost calls, freeze state, where its
chunks start) changes whenever the rollout does; its entries are in **chunks** (binary: the entries' stored forms
laid end to end, :mod:`.entries`), each written once: a checkpoint cuts a new chunk of the entries stored since
the previous one, and the chunks before keep their bytes, so the pack writer references them in the earlier
checkpoint's packs instead of writing them again. A rollout that grew by one call since the last checkpoint costs
that call's chunk and its head. A new chunk is merged with the trailing chunks no bigger than it: each merge at least
doubles the chunk an entry is in, so an entry is written again only log2(how much its chunk grew) times, and a
rollout has a few chunks, however many checkpoints it lived through. A restore changes the head (attempt + 1,
version + 1), never a chunk: the first checkpoint after it references them all.

A rollout's first call's prompt is a record of its own (its **first prompt**, ``.p``), byte for byte the prompt record
of that call's generation (:mod:`..prefixes`), and the first chunk's first entry is written against it (chunk layout
2): a first prompt a checkpoint wrote while its call ran is referenced, not written again, once the call is stored.

Under the pause :func:`frozen_records` only slices lists of bytes; :data:`LEDGER_ENCODER` lays them out after
resume. :func:`parse_records` reads a checkpoint's records back: schema 3, schema 2 (a JSON head and a JSON entries
record) and schema 1 (one JSON record, its entries inline).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base import token_codec
from gym_services.control.participant import FrozenRecord, InvalidState, Record, RestoredRecord, Scope
from gym_services.models.policy_model.ledger.entries import EntryLog, split_stored
from gym_services.models.policy_model.ledger.rollouts import RolloutLedger, TokenLedger
from gym_services.models.policy_model.ledger.wire import ROLLOUT_ID, LedgerEntry
from gym_services.models.policy_model.prefixes import FrozenPrompt, encode_prompt, read_prompt

LEDGER_RECORD_SCHEMA_VERSION = 3
RECORD_PREFIX = "ledger-"
#: a chunk's key: the head's key, this and the index of its first entry
CHUNK_INFIX = ".e"
#: schema 2's entries record: the head's key and this (read only)
ENTRIES_SUFFIX = ".entries"
#: the rollout's first prompt record: the head's key and this
FIRST_PROMPT_SUFFIX = ".p"
#: the first byte of a chunk (its layout's version): every entry written against the one before, the first against
#: nothing
CHUNK_LAYOUT = 1
#: a chunk from entry 0 whose first entry is written against the rollout's first prompt record
CHUNK_LAYOUT_FIRST_PROMPT = 2
_CHUNK_KEY = re.compile(r"^(ledger-[0-9a-f]{64})\.e(\d+)$")
#: a call id that is a request digest: the policy model recorded the call itself (``.recording``)
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class LedgerHead(BaseModel):
    """A rollout's ledger head in a checkpoint (schema 3): its entries are the chunks starting at ``chunks``
    (entry indices, ascending, the first 0), ``entries`` in all. ``intents`` in order: an entry's index for a
    call that was stored, the call id of one that was not (yet). A dropped rollout's head is the whole of it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[3]
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    attempt: int = Field(ge=0)
    entries: int = Field(ge=0)
    chunks: list[int]
    intents: list[int | str]
    lost: dict[str, str]
    frozen: bool
    snapshot_id: str
    version: int = Field(ge=0)
    dropped: bool


class LedgerRecordV2(BaseModel):
    """Schema 2's head: its entries are the JSON :class:`LedgerEntriesV2` record beside it. Read only."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2]
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    attempt: int = Field(ge=0)
    entries: int = Field(ge=0)
    intents: list[str]
    lost: dict[str, str]
    frozen: bool
    snapshot_id: str
    version: int = Field(ge=0)
    dropped: bool


class LedgerEntriesV2(BaseModel):
    """Schema 2's entries record: a rollout's entries as JSON, in the order stored. Read only."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2]
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    entries: list[LedgerEntry]


class LedgerRecordV1(BaseModel):
    """Schema 1: one JSON record per rollout, its entries inline. Read only."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    attempt: int = Field(ge=0)
    entries: list[LedgerEntry]
    intents: list[str]
    lost: dict[str, str]
    frozen: bool
    snapshot_id: str
    version: int = Field(ge=0)
    dropped: bool


@dataclass(frozen=True)
class FrozenLedgerRecord:
    """One of a rollout's records as the capture froze it: its head (``head``, the fields), one of its chunks
    (``head`` None: the stored entries from entry ``first`` on), or its first prompt record (``first_prompt``, the
    first entry's call id; ``stored``: that entry). A chunk from entry 0 with ``first_prompt`` writes its first
    entry against that record."""

    rollout_id: str
    head: dict[str, Any] | None
    first: int = 0
    stored: tuple[bytes, ...] = ()
    first_prompt: str | None = None
    #: the first prompt record itself (not a chunk)
    is_prompt: bool = False

    @property
    def lasting(self) -> bool:
        """Whether its bytes stay the same from one checkpoint to the next (a chunk, a first prompt)."""
        return self.head is None


def _whole(entry: bytes) -> tuple[bytes, token_codec.Decoded, array[int]]:
    """A first entry (written against nothing): its JSON, its triple and its prompt."""
    rest, triple, _ = token_codec.read_entry(entry)
    return rest, triple, triple.prompt(array("I"))


def _chunk_bytes(state: FrozenLedgerRecord) -> bytes:
    stored = state.stored
    out = bytearray((CHUNK_LAYOUT_FIRST_PROMPT if state.first_prompt is not None else CHUNK_LAYOUT,))
    token_codec.write_varint(state.first, out)
    token_codec.write_varint(len(stored), out)
    if state.first_prompt is not None:  # its prompt is the first prompt record's: a varint here
        rest, triple, prompt = _whole(stored[0])
        token_codec.write_entry(rest, triple.tokens(array("I")), prompt, out)
        stored = stored[1:]
    return bytes(out) + b"".join(stored)


def _first_prompt_bytes(state: FrozenLedgerRecord) -> bytes:
    """Byte for byte the prompt record (:func:`~gym_services.models.policy_model.prefixes.encode_prompt`) the
    rollout's first call had while it ran, so a checkpoint that held that call references it."""
    assert state.first_prompt is not None
    _, _, prompt = _whole(state.stored[0])
    return encode_prompt(FrozenPrompt(state.rollout_id, state.first_prompt, prompt))


class LedgerEncoder:
    """The policy model participant's :class:`~gym_services.control.participant.RecordEncoder`: a head's JSON,
    a chunk's layout (its first entry's index, its count, the stored entries), or a first prompt record."""

    def encode(self, state: FrozenLedgerRecord) -> bytes:
        if state.head is not None:
            return json.dumps(state.head, ensure_ascii=False, separators=(",", ":")).encode()
        if state.is_prompt:
            return _first_prompt_bytes(state)
        return _chunk_bytes(state)

    def encoded(self, state: FrozenLedgerRecord, data: bytes) -> None:
        pass


LEDGER_ENCODER = LedgerEncoder()


def ledger_record_key(rollout_id: str) -> str:
    return RECORD_PREFIX + hashlib.sha256(rollout_id.encode()).hexdigest()


def chunk_key(rollout_id: str, first: int) -> str:
    return f"{ledger_record_key(rollout_id)}{CHUNK_INFIX}{first}"


def first_prompt_key(rollout_id: str) -> str:
    return ledger_record_key(rollout_id) + FIRST_PROMPT_SUFFIX


def entries_key(rollout_id: str) -> str:
    """Schema 2's entries record."""
    return ledger_record_key(rollout_id) + ENTRIES_SUFFIX


def is_ledger_record(key: str) -> bool:
    return key.startswith(RECORD_PREFIX)


# --- capture ---------------------------------------------------------------------------


def cut_chunks(rows: RolloutLedger) -> list[tuple[int, int]]:
    """The rollout's chunks as (first, end) entry ranges, once the entries stored since the last cut are a chunk
    of their own, merged with the trailing chunks no bigger than it (so a cut rewrites at most its own bytes).
    Updates ``rows.chunks`` and ``rows.chunked``; runs under the pause (sums of a few lengths)."""
    stored = rows.entries.stored
    count = len(stored)
    if count < rows.chunked:  # cannot happen (entries only grow); start over rather than write a wrong chunk
        rows.chunks, rows.chunked = [], 0
    if count > rows.chunked:
        start = rows.chunked
        size = sum(len(s) for s in stored[start:])
        while rows.chunks:
            previous = rows.chunks[-1]
            previous_size = sum(len(s) for s in stored[previous:start])
            if previous_size > size:
                break
            rows.chunks.pop()
            start, size = previous, size + previous_size
        rows.chunks.append(start)
        rows.chunked = count
    if not rows.chunks:
        return []
    ends = [*rows.chunks[1:], count]
    return list(zip(rows.chunks, ends, strict=True))


def first_prompt(rows: RolloutLedger) -> str | None:
    """The call id of the rollout's first entry when its prompt goes in a first prompt record: when the call id
    is a request digest (the policy model recorded the call itself, so the prompt record of its generation, if a
    checkpoint held one, has that record's bytes); None for a call stored under another id."""
    first = rows.entries.first_call_id()  # under the pause: not a list of every call id
    return first if first is not None and _DIGEST.match(first) else None


def _head(rollout_id: str, ledger: RolloutLedger) -> dict[str, Any]:
    entries = ledger.entries
    return {
        "schema_version": LEDGER_RECORD_SCHEMA_VERSION,
        "rollout_id": rollout_id,
        "attempt": ledger.attempt,
        "entries": len(entries),
        "chunks": list(ledger.chunks),
        "intents": [entries.index(call) if call in entries else call for call in ledger.intents],
        "lost": dict(ledger.lost),
        "frozen": ledger.frozen,
        "snapshot_id": ledger.snapshot_id,
        "version": ledger.version,
        "dropped": ledger.dropped,
    }


def frozen_records(ledger: TokenLedger, scope: Scope) -> list[FrozenRecord[FrozenLedgerRecord]]:
    """Every rollout's records as they are now, encoded later (:data:`LEDGER_ENCODER`): every rollout's first prompt
    record and chunks first, then the heads (which change at every checkpoint): packs fill in this order, so the
    chunks a later checkpoint references share packs with few records it does not.

    A rollout's first call's prompt (its system prompt, tool schemas and first message: most of what a rollout holds
    that no other call repeats) is a record of its own, byte for byte the prompt record that call's generation had
    while it ran (:func:`first_prompt`), and the first chunk's first entry is written against it: a prompt a
    checkpoint wrote while its call ran is not written again once the call is in the ledger.

    A rollout outside ``scope`` (finished: the controller runs it no more) is still written, its ledger waiting
    for the trainer, but without rollout identity in the manifest: the restore does not count it as a live
    episode. Once the trainer dropped it, it is not written: a finished rollout remembered as dropped only refuses
    late writes here, and would otherwise add a record to every checkpoint."""
    chunks: list[FrozenRecord[FrozenLedgerRecord]] = []
    heads: list[FrozenRecord[FrozenLedgerRecord]] = []
    for rollout_id, rows in sorted(ledger.rollouts.items()):
        live = scope.includes(rollout_id)
        if rows.dropped and not live:
            continue
        identity: dict[str, Any] = {"rollout_id": rollout_id, "attempt": rows.attempt} if live else {}
        stored = rows.entries.stored
        digest = first_prompt(rows)
        if digest is not None:
            state = FrozenLedgerRecord(rollout_id, None, 0, (stored[0],), digest, is_prompt=True)
            chunks.append(FrozenRecord(first_prompt_key(rollout_id), state, **identity))
        for first, end in cut_chunks(rows):
            against = digest if first == 0 else None
            state = FrozenLedgerRecord(rollout_id, None, first, tuple(stored[first:end]), against)
            chunks.append(FrozenRecord(chunk_key(rollout_id, first), state, **identity))
        heads.append(
            FrozenRecord(
                ledger_record_key(rollout_id), FrozenLedgerRecord(rollout_id, _head(rollout_id, rows)), **identity
            )
        )
    return chunks + heads


def encoded_records(ledger: TokenLedger, scope: Scope) -> list[Record]:
    """:func:`frozen_records`, encoded now."""
    return [
        Record(p.key, LEDGER_ENCODER.encode(p.state), rollout_id=p.rollout_id, attempt=p.attempt)
        for p in frozen_records(ledger, scope)
    ]


def entry_sequence(rows: RolloutLedger, index: int) -> array[int]:
    """Entry ``index``'s prompt + generated ids (what a cut generation of the rollout's next call continues)."""
    for i, sequence in enumerate(rows.entries.sequences()):
        if i == index:
            return sequence
    raise IndexError(f"the ledger holds {len(rows.entries)} entries, not {index + 1}")


# --- restore ---------------------------------------------------------------------------


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])


def _check_identity(record: RestoredRecord, head: RestoredRecord) -> None:
    if (record.rollout_id, record.attempt) != (head.rollout_id, head.attempt):
        raise InvalidState(f"record {record.key}: manifest identity does not match its head's")


def _chunk(record: RestoredRecord, first: int) -> list[bytes]:
    data = memoryview(record.data)
    if not data or data[0] not in (CHUNK_LAYOUT, CHUNK_LAYOUT_FIRST_PROMPT) or (data[0] != CHUNK_LAYOUT and first):
        raise InvalidState(f"record {record.key} is not a ledger chunk")
    try:
        at, offset = token_codec.read_varint(data, 1)
        count, offset = token_codec.read_varint(data, offset)
        stored = split_stored(data[offset:])
    except token_codec.TokenCodecError as exc:
        raise InvalidState(f"record {record.key} is not a ledger chunk: {exc}") from None
    if at != first or len(stored) != count:
        raise InvalidState(f"record {record.key} holds {len(stored)} entries from {at}, its key names entry {first}")
    return stored


def _against_first_prompt(head: LedgerHead, entry: bytes, prompt: RestoredRecord | None) -> bytes:
    """A first entry written against the rollout's first prompt record, written against nothing again (the form
    the ledger holds)."""
    key = first_prompt_key(head.rollout_id)
    if prompt is None:
        raise InvalidState(f"record {chunk_key(head.rollout_id, 0)}: its first prompt record {key} is missing")
    held, decoded = read_prompt(prompt)
    try:
        rest, triple, end = token_codec.read_entry(entry)
        call = json.loads(rest).get("model_call_id")
        if decoded.shared or held.base is not None or end != len(entry):
            raise token_codec.TokenCodecError("the prompt is not written whole")
        ids = decoded.prompt(array("I"))
        if triple.shared != len(ids) or len(triple.fresh):
            raise token_codec.TokenCodecError(f"its prompt is not the {len(ids)} ids of the first prompt")
        tokens = triple.tokens(ids)
    except (token_codec.TokenCodecError, ValueError, AttributeError) as exc:
        raise InvalidState(f"record {key}: the rollout's first entry does not continue it: {exc}") from None
    if (held.rollout_id, held.digest) != (head.rollout_id, call):
        raise InvalidState(f"record {key} holds the prompt of another call than the rollout's first entry")
    return bytes(token_codec.write_entry(rest, tokens, (), bytearray()))


def _v3(record: RestoredRecord, head: LedgerHead, chunks: dict[str, RestoredRecord]) -> RolloutLedger:
    starts = head.chunks
    if (head.entries and (not starts or starts[0] != 0)) or any(b <= a for a, b in itertools.pairwise(starts)):
        raise InvalidState(f"record {record.key}: its chunks {starts} do not cover its {head.entries} entries")
    stored: list[bytes] = []
    for first in starts:
        chunk = chunks.pop(chunk_key(head.rollout_id, first), None)
        if chunk is None:
            raise InvalidState(f"record {record.key}: its chunk {chunk_key(head.rollout_id, first)} is missing")
        _check_identity(chunk, record)
        if len(stored) != first:
            raise InvalidState(f"record {chunk.key}: starts at entry {first}, the chunks before end at {len(stored)}")
        stored.extend(_chunk(chunk, first))
        if chunk.data[0] == CHUNK_LAYOUT_FIRST_PROMPT and stored:
            prompt = chunks.pop(first_prompt_key(head.rollout_id), None)
            if prompt is not None:
                _check_identity(prompt, record)
            stored[0] = _against_first_prompt(head, stored[0], prompt)
    if len(stored) != head.entries:
        raise InvalidState(f"record {record.key}: its chunks hold {len(stored)} entries, it names {head.entries}")
    try:
        log = EntryLog.of_stored(head.rollout_id, stored)
    except (ValueError, ValidationError) as exc:
        raise InvalidState(f"record {record.key}: an entry of its chunks is invalid: {exc}") from None
    for intent in head.intents:
        if isinstance(intent, int) and not 0 <= intent < len(log):
            raise InvalidState(f"record {record.key}: intent {intent} names no entry")
    return _restored(head, log, list(starts))


def _restored(head: LedgerHead | LedgerRecordV2 | LedgerRecordV1, log: EntryLog, chunks: list[int]) -> RolloutLedger:
    intents = head.intents
    if isinstance(head, LedgerHead):
        calls = log.call_ids()
        intents = [calls[i] if isinstance(i, int) else i for i in head.intents]
    return RolloutLedger(
        attempt=head.attempt + 1,
        entries=log,
        chunks=chunks,
        chunked=len(log) if chunks else 0,
        intents=dict.fromkeys(str(i) for i in intents),
        lost=dict(head.lost),
        frozen=head.frozen,
        snapshot_id=head.snapshot_id,
        version=head.version + 1,  # a freeze consumed before the restore cannot retire these rows
        dropped=head.dropped,
    )


def _json_entries(record: RestoredRecord, rollout_id: str, entries: list[LedgerEntry]) -> EntryLog:
    log = EntryLog()
    for entry in entries:
        if entry.rollout_id != rollout_id or entry.model_call_id in log:
            raise InvalidState(f"record {record.key}: entry {entry.model_call_id!r} is not one of this rollout's calls")
        log.append(entry)
    return log


def _v2(record: RestoredRecord, head: LedgerRecordV2, beside: RestoredRecord | None) -> RolloutLedger:
    key = entries_key(head.rollout_id)
    entries: list[LedgerEntry] = []
    if beside is None and head.entries:
        raise InvalidState(f"record {record.key}: its entries record {key} is missing")
    if beside is not None:
        _check_identity(beside, record)
        try:
            held = LedgerEntriesV2.model_validate_json(beside.data)
        except ValidationError as exc:
            raise InvalidState(f"record {beside.key} is not a ledger entries record: {_problems(exc)}") from None
        if held.rollout_id != head.rollout_id:
            raise InvalidState(f"record {key}: holds entries of {held.rollout_id!r}, its head is {head.rollout_id!r}")
        entries = held.entries
    if len(entries) != head.entries:
        raise InvalidState(f"record {key}: holds {len(entries)} entries, its head names {head.entries}")
    return _restored(head, _json_entries(record, head.rollout_id, entries), [])


def _parse_head(record: RestoredRecord) -> LedgerHead | LedgerRecordV2 | LedgerRecordV1:
    try:
        version = json.loads(record.data).get("schema_version")
    except (ValueError, AttributeError):
        raise InvalidState(f"record {record.key} is not a ledger record: not a JSON object") from None
    if version not in (1, 2, LEDGER_RECORD_SCHEMA_VERSION):
        raise InvalidState(f"record {record.key}: ledger schema_version {version!r} is not supported")
    try:
        if version == 1:
            return LedgerRecordV1.model_validate_json(record.data)
        if version == 2:
            return LedgerRecordV2.model_validate_json(record.data)
        return LedgerHead.model_validate_json(record.data)
    except ValidationError as exc:
        raise InvalidState(f"record {record.key} is not a ledger record: {_problems(exc)}") from None


def parse_records(records: list[RestoredRecord]) -> dict[str, RolloutLedger]:
    """Parse the checkpoint's ledger records (each rollout's head and its chunks, or its older records); each
    rollout's rows belong to attempt + 1."""
    beside = (ENTRIES_SUFFIX, FIRST_PROMPT_SUFFIX)
    heads = [r for r in records if not r.key.endswith(beside) and not _CHUNK_KEY.match(r.key)]
    others = {r.key: r for r in records if r.key.endswith(beside) or _CHUNK_KEY.match(r.key)}
    restored: dict[str, RolloutLedger] = {}
    for record in heads:
        head = _parse_head(record)
        if record.key != ledger_record_key(head.rollout_id):
            raise InvalidState(f"record {record.key} does not hold the ledger its key names")
        if record.rollout_id is not None and (record.rollout_id != head.rollout_id or record.attempt != head.attempt):
            raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
        if isinstance(head, LedgerHead):
            restored[head.rollout_id] = _v3(record, head, others)
        elif isinstance(head, LedgerRecordV2):
            restored[head.rollout_id] = _v2(record, head, others.pop(entries_key(head.rollout_id), None))
        else:
            restored[head.rollout_id] = _restored(head, _json_entries(record, head.rollout_id, head.entries), [])
    if others:
        raise InvalidState(f"record {min(others)} holds ledger entries without their head record")
    return restored
