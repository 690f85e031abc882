"""The token ledger in a checkpoint: two records per rollout (``docs/protocol.md``, "The token ledger").

A rollout's **head** (:class:`LedgerRecord`: attempt, version, intents, lost calls, freeze state) and its
**entries** (:class:`LedgerEntries`, the stored entries in order) are apart, so that a restore, which
installs the rows under attempt + 1 (attempt N is retired: its late writes are refused) and so changes
every head, leaves the entries' bytes as they were: the next checkpoint references them in the restored
checkpoint's packs instead of writing every rollout's tokens again.

Under the pause :func:`frozen_records` only copies lists (an entry is held as its JSON, which never
changes); :data:`LEDGER_ENCODER` encodes them after resume, in a worker thread. :func:`parse_records`
reads a checkpoint's records back (schema 2, and schema 1's single record with its entries inline).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.control.participant import FrozenRecord, InvalidState, Record, RestoredRecord, Scope
from gym_services.models.policy_model.ledger.rollouts import RolloutLedger, TokenLedger
from gym_services.models.policy_model.ledger.wire import ROLLOUT_ID, LedgerEntry

LEDGER_RECORD_SCHEMA_VERSION = 2
RECORD_PREFIX = "ledger-"
#: the entries record's key: the head's key and this
ENTRIES_SUFFIX = ".entries"


class LedgerRecord(BaseModel):
    """A rollout's ledger head in a checkpoint; its entries are the :class:`LedgerEntries` record beside it
    (``entries``: how many it holds). A dropped rollout's head is the whole of it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    attempt: int = Field(ge=0)
    entries: int = Field(ge=0)
    intents: list[str]
    lost: dict[str, str]
    frozen: bool
    snapshot_id: str
    version: int = Field(ge=0)
    dropped: bool


class LedgerRecordV1(BaseModel):
    """Schema 1: one record per rollout, its entries inline. A restore still reads it (a checkpoint taken
    before an upgrade is restored after it); nothing writes it."""

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


class LedgerEntries(BaseModel):
    """A rollout's stored entries in a checkpoint, in the order they were stored. It holds nothing a restore
    changes, so an unchanged rollout's entries keep their bytes (and are reused) across checkpoints and restores."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    entries: list[LedgerEntry]


_Parsed = TypeVar("_Parsed", LedgerRecord, LedgerEntries)


@dataclass(frozen=True)
class FrozenLedgerRecord:
    """One of a rollout's two records as the capture froze it: its head fields (``head``), or, for its entries
    record (``head`` None), its entries' stored JSON."""

    rollout_id: str
    head: dict[str, Any] | None
    entries: list[str]


class LedgerEncoder:
    """The policy model participant's :class:`~gym_services.control.participant.RecordEncoder`: a
    :class:`LedgerRecord`'s JSON, or a :class:`LedgerEntries`' with the entries spliced in as stored (each
    already its JSON)."""

    def encode(self, state: FrozenLedgerRecord) -> bytes:
        if state.head is not None:
            return json.dumps(state.head, ensure_ascii=False, separators=(",", ":")).encode()
        head = json.dumps(
            {"schema_version": LEDGER_RECORD_SCHEMA_VERSION, "rollout_id": state.rollout_id},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return f'{head[:-1]},"entries":[{",".join(state.entries)}]}}'.encode()

    def encoded(self, state: FrozenLedgerRecord, data: bytes) -> None:
        pass


LEDGER_ENCODER = LedgerEncoder()


def ledger_record_key(rollout_id: str) -> str:
    return RECORD_PREFIX + hashlib.sha256(rollout_id.encode()).hexdigest()


def entries_key(rollout_id: str) -> str:
    return ledger_record_key(rollout_id) + ENTRIES_SUFFIX


def is_ledger_record(key: str) -> bool:
    return key.startswith(RECORD_PREFIX)


# --- capture ---------------------------------------------------------------------------


def _head(rollout_id: str, ledger: RolloutLedger) -> dict[str, Any]:
    return {
        "schema_version": LEDGER_RECORD_SCHEMA_VERSION,
        "rollout_id": rollout_id,
        "attempt": ledger.attempt,
        "entries": len(ledger.entries),
        "intents": list(ledger.intents),
        "lost": dict(ledger.lost),
        "frozen": ledger.frozen,
        "snapshot_id": ledger.snapshot_id,
        "version": ledger.version,
        "dropped": ledger.dropped,
    }


def frozen_records(ledger: TokenLedger, scope: Scope) -> list[FrozenRecord[FrozenLedgerRecord]]:
    """Every rollout's records as they are now, encoded later (:data:`LEDGER_ENCODER`).

    A rollout outside ``scope`` (finished: the controller runs it no more) is still written, its
    ledger waiting for the trainer, but without rollout identity in the manifest: the restore does
    not count it as a live episode. Once the trainer dropped it, it is not written: a finished rollout
    remembered as dropped only refuses late writes here, and would otherwise add a record to every
    checkpoint."""
    pending: list[FrozenRecord[FrozenLedgerRecord]] = []
    for rollout_id, rows in sorted(ledger.rollouts.items()):
        live = scope.includes(rollout_id)
        if rows.dropped and not live:
            continue
        frozen = [(ledger_record_key(rollout_id), FrozenLedgerRecord(rollout_id, _head(rollout_id, rows), []))]
        if rows.entries:  # a rollout without entries (a dropped or retired one) has no entries record
            stored = FrozenLedgerRecord(rollout_id, None, list(rows.entries.values()))
            frozen.append((entries_key(rollout_id), stored))
        for key, state in frozen:
            if live:
                pending.append(FrozenRecord(key, state, rollout_id=rollout_id, attempt=rows.attempt))
            else:
                pending.append(FrozenRecord(key, state))
    return pending


def encoded_records(ledger: TokenLedger, scope: Scope) -> list[Record]:
    """:func:`frozen_records`, encoded now."""
    return [
        Record(p.key, LEDGER_ENCODER.encode(p.state), rollout_id=p.rollout_id, attempt=p.attempt)
        for p in frozen_records(ledger, scope)
    ]


# --- restore ---------------------------------------------------------------------------


def _parse(model: type[_Parsed], record: RestoredRecord) -> _Parsed:
    try:
        payload = model.model_validate_json(record.data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a ledger record: {problems}") from None
    if payload.schema_version != LEDGER_RECORD_SCHEMA_VERSION:
        raise InvalidState(f"record {record.key}: ledger schema_version {payload.schema_version} is not supported")
    return payload


def _parse_head(record: RestoredRecord) -> tuple[LedgerRecord, list[LedgerEntry] | None]:
    """A rollout's head, and its entries when the record is schema 1's (entries inline)."""
    try:
        old = LedgerRecordV1.model_validate_json(record.data)
    except ValidationError:
        return _parse(LedgerRecord, record), None
    fields = old.model_dump(exclude={"entries", "schema_version"})
    head = LedgerRecord(schema_version=LEDGER_RECORD_SCHEMA_VERSION, entries=len(old.entries), **fields)
    return head, old.entries


def _entries_of(
    head: LedgerRecord, record: RestoredRecord, inline: list[LedgerEntry] | None, beside: RestoredRecord | None
) -> dict[str, str]:
    """The head's entries (inline, or the entries record beside it), checked against the head: call id ->
    canonical JSON."""
    key = entries_key(head.rollout_id)
    if inline is not None and beside is not None:
        raise InvalidState(f"record {record.key}: a schema 1 ledger record holds its entries itself")
    if inline is None and beside is None and head.entries:
        raise InvalidState(f"record {record.key}: its entries record {key} is missing")
    held = LedgerEntries(schema_version=LEDGER_RECORD_SCHEMA_VERSION, rollout_id=head.rollout_id, entries=inline or [])
    if beside is not None:
        if (beside.rollout_id, beside.attempt) != (record.rollout_id, record.attempt):
            raise InvalidState(f"record {beside.key}: manifest identity does not match its head's")
        held = _parse(LedgerEntries, beside)
    if held.rollout_id != head.rollout_id or len(held.entries) != head.entries:
        raise InvalidState(
            f"record {key}: holds {len(held.entries)} entries of {held.rollout_id!r}, its head names "
            f"{head.entries} of {head.rollout_id!r}"
        )
    entries: dict[str, str] = {}
    for entry in held.entries:
        if entry.rollout_id != head.rollout_id or entry.model_call_id in entries:
            raise InvalidState(f"record {key}: entry {entry.model_call_id!r} is not one of this rollout's calls")
        entries[entry.model_call_id] = entry.canonical()
    return entries


def parse_records(records: list[RestoredRecord]) -> dict[str, RolloutLedger]:
    """Parse the checkpoint's ledger records (each rollout's head and entries); each rollout's rows belong
    to attempt + 1."""
    heads = [r for r in records if not r.key.endswith(ENTRIES_SUFFIX)]
    stored = {r.key: r for r in records if r.key.endswith(ENTRIES_SUFFIX)}
    restored: dict[str, RolloutLedger] = {}
    for record in heads:
        head, inline = _parse_head(record)
        if record.key != ledger_record_key(head.rollout_id):
            raise InvalidState(f"record {record.key} does not hold the ledger its key names")
        if record.rollout_id is not None and (record.rollout_id != head.rollout_id or record.attempt != head.attempt):
            raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
        entries = _entries_of(head, record, inline, stored.pop(entries_key(head.rollout_id), None))
        restored[head.rollout_id] = RolloutLedger(
            attempt=head.attempt + 1,
            entries=entries,
            intents=dict.fromkeys(head.intents),
            lost=dict(head.lost),
            frozen=head.frozen,
            snapshot_id=head.snapshot_id,
            version=head.version + 1,  # a freeze consumed before the restore cannot retire these rows
            dropped=head.dropped,
        )
    if stored:
        raise InvalidState(f"record {min(stored)} holds ledger entries without their head record")
    return restored
