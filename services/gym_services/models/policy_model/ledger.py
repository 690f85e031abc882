"""The capture ledger: each rollout's training tokens, one entry per model call (``docs/decisions.md``,
"The capture ledger lives with the rollout's policy model replica").

It keeps NeMo Gym 0.7.0's token-capture contracts (``TokenSink``, ``TokenSource`` in
``nemo_gym/token_id_capture/protocols.py``) for the rollouts this replica serves:

- ``put`` stores an entry; once it returns (the route answered) every later read sees it. A retry of
  the same payload is a no-op; another payload under the same call id is refused (``409
  ledger_conflict``) and masks the rollout;
- ``begin_call`` records an intent before a call is dispatched; an intent without an entry at freeze
  masks the rollout (the call was lost);
- ``mark_incomplete`` records a lost call; it works after freeze too and moves the version;
- ``freeze`` stops writes (``409 ledger_closed``) and returns one snapshot (``snapshot_id``,
  ``version``, ``incomplete``); freezing again returns the same snapshot;
- ``resolve`` names the stored call a request continues, or none (lineage, :mod:`.ledger_lineage`);
- ``drop`` retires exactly a consumed snapshot: with another version it changes nothing and answers
  false. A dropped rollout keeps a tombstone, so a late write is still refused: the newest
  :data:`TOMBSTONES_KEPT` of them, in memory only (a checkpoint writes the tombstone of a rollout still in its
  scope, never a finished one's), so dropped rollouts cost a bounded amount however many there were.

Attempts: every write carries the rollout's attempt. The ledger belongs to one attempt of a rollout; a
write from an older one is refused (``409 stale_attempt``); a write from a newer one raises the
ledger's attempt (a retire, not a write, removes a retired attempt's rows). In a checkpoint the ledger
is two records per rollout: its head (:class:`LedgerRecord`: attempt, version, intents, ...) and its entries
(:class:`LedgerEntries`), apart so that a restore, which installs the rows under attempt + 1 (attempt N is
retired: its late writes are refused) and so changes every head, leaves the entries' bytes as they were: the
next checkpoint references them in the restored checkpoint's packs instead of writing every rollout's tokens
again.
Intents travel with the rows: a call in flight at the checkpoint whose re-issue never completes leaves
its intent dangling, and the rollout freezes incomplete instead of being trained on with a hole.

Durability: the ledger is held in the replica's memory and made durable by the checkpoint (the model
participant's records). What a replica held after its last checkpoint dies with it, together with the
attempt that wrote it: a restore resumes the rollout as attempt + 1 from the checkpoint's rows.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.participant import FrozenRecord, InvalidState, Record, RestoredRecord, Scope
from gym_services.models.policy_model import ledger_lineage
from gym_services.models.policy_model.ledger_wire import ROLLOUT_ID, LedgerEntry, Resolution, Snapshot

LEDGER_RECORD_SCHEMA_VERSION = 2
RECORD_PREFIX = "ledger-"
#: the entries record's key: the head's key and this
ENTRIES_SUFFIX = ".entries"
#: the reason of a call begun (an intent) and never stored
NEVER_STORED = "begun and never stored"
#: dropped rollouts whose tombstone is kept (their late writes refused), the newest drops; an older one is forgotten
TOMBSTONES_KEPT = 4096


@dataclass(slots=True)
class RolloutLedger:
    """One rollout's rows for one attempt."""

    attempt: int
    #: call id -> the entry's canonical JSON: only the text is held (a parsed entry's token ids and log-probs,
    #: each a Python object, take several times its bytes); a read parses it again
    entries: dict[str, str] = field(default_factory=dict)
    intents: dict[str, None] = field(default_factory=dict)
    #: call ids marked lost ("" when the caller did not know which call)
    lost: dict[str, str] = field(default_factory=dict)
    frozen: bool = False
    snapshot_id: str = ""
    version: int = 0
    dropped: bool = False

    def parsed(self) -> list[LedgerEntry]:
        return [LedgerEntry.model_validate_json(canonical) for canonical in self.entries.values()]

    def dangling(self) -> list[str]:
        return [c for c in self.intents if c not in self.entries]

    def snapshot(self, rollout_id: str) -> Snapshot:
        lost = {**{call: NEVER_STORED for call in self.dangling()}, **self.lost}
        return Snapshot(
            rollout_id=rollout_id,
            attempt=self.attempt,
            entries=self.parsed(),
            incomplete=bool(lost),
            snapshot_id=self.snapshot_id,
            version=self.version,
            lost_calls=lost,
        )


class LedgerRecord(BaseModel):
    """A rollout's ledger head in a checkpoint (``docs/protocol.md``, "The capture ledger"); its entries are
    the :class:`LedgerEntries` record beside it (``entries``: how many it holds)."""

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
    """Schema 1 (before issue 29): one record per rollout, its entries inline. A restore still reads it (a
    checkpoint taken before an upgrade is restored after it); nothing writes it."""

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
class FrozenLedger:
    """One of a rollout's two records as a capture froze it: its head fields (``head``), or, for its entries
    record (``head`` None), its entries' stored JSON."""

    rollout_id: str
    head: dict[str, Any] | None
    entries: list[str]


class LedgerEncoder:
    """The policy model participant's :class:`~gym_services.control.participant.RecordEncoder`: a
    :class:`LedgerRecord`'s JSON, or a :class:`LedgerEntries`' with the entries spliced in as stored (each
    already its JSON)."""

    def encode(self, state: FrozenLedger) -> bytes:
        if state.head is not None:
            return json.dumps(state.head, ensure_ascii=False, separators=(",", ":")).encode()
        head = json.dumps(
            {"schema_version": LEDGER_RECORD_SCHEMA_VERSION, "rollout_id": state.rollout_id},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return f'{head[:-1]},"entries":[{",".join(state.entries)}]}}'.encode()

    def encoded(self, state: FrozenLedger, data: bytes) -> None:
        pass


LEDGER_ENCODER = LedgerEncoder()


def ledger_record_key(rollout_id: str) -> str:
    return RECORD_PREFIX + hashlib.sha256(rollout_id.encode()).hexdigest()


def entries_key(rollout_id: str) -> str:
    return ledger_record_key(rollout_id) + ENTRIES_SUFFIX


def is_ledger_record(key: str) -> bool:
    return key.startswith(RECORD_PREFIX)


def _parse(model: type[_Parsed], record: RestoredRecord) -> _Parsed:
    try:
        payload = model.model_validate_json(record.data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
        raise InvalidState(f"record {record.key} is not a ledger record: {problems}") from None
    if payload.schema_version != LEDGER_RECORD_SCHEMA_VERSION:
        raise InvalidState(f"record {record.key}: ledger schema_version {payload.schema_version} is not supported")
    return payload


def _head(record: RestoredRecord) -> tuple[LedgerRecord, list[LedgerEntry] | None]:
    """A rollout's head, and its entries when the record is schema 1's (entries inline)."""
    try:
        old = LedgerRecordV1.model_validate_json(record.data)
    except ValidationError:
        return _parse(LedgerRecord, record), None
    fields = old.model_dump(exclude={"entries", "schema_version"})
    head = LedgerRecord(schema_version=LEDGER_RECORD_SCHEMA_VERSION, entries=len(old.entries), **fields)
    return head, old.entries


class CaptureLedger:
    """Every rollout's ledger on this replica."""

    def __init__(self, tombstones_kept: int = TOMBSTONES_KEPT) -> None:
        self.rollouts: dict[str, RolloutLedger] = {}
        self.tombstones_kept = tombstones_kept
        #: the rollouts dropped (each a tombstone in :attr:`rollouts`), oldest first
        self._buried: OrderedDict[str, None] = OrderedDict()

    # --- writes (sink) ---------------------------------------------------------------

    def _writable(self, rollout_id: str, attempt: int, *, after_freeze: bool = False) -> RolloutLedger:
        ledger = self.rollouts.get(rollout_id)
        if ledger is not None and attempt < ledger.attempt:
            raise ApiError(
                ErrorCode.STALE_ATTEMPT,
                f"rollout {rollout_id!r} attempt {attempt} is stale: the ledger holds attempt {ledger.attempt}",
                details={"rollout_id": rollout_id, "attempt": attempt, "current": ledger.attempt},
            )
        if ledger is None:
            ledger = self.rollouts[rollout_id] = RolloutLedger(attempt=attempt)
        elif attempt > ledger.attempt:  # the rows stay (a retire removes a retired attempt's); older writes are refused
            ledger.attempt = attempt
        if ledger.dropped:
            raise ApiError(ErrorCode.LEDGER_CLOSED, f"rollout {rollout_id!r}: its ledger was retired (dropped)")
        if ledger.frozen and not after_freeze:
            raise ApiError(
                ErrorCode.LEDGER_CLOSED, f"rollout {rollout_id!r}: its ledger is frozen (snapshot {ledger.snapshot_id})"
            )
        return ledger

    def put(self, entry: LedgerEntry, attempt: int) -> tuple[bool, int]:
        """Store one entry; (stored, version). Same payload again: (False, version)."""
        ledger = self._writable(entry.rollout_id, attempt)
        canonical = entry.canonical()
        existing = ledger.entries.get(entry.model_call_id)
        if existing is not None:
            if existing == canonical:
                return False, ledger.version
            ledger.lost.setdefault(entry.model_call_id, "conflicting payloads for one call id")
            ledger.version += 1
            raise ApiError(
                ErrorCode.LEDGER_CONFLICT,
                f"rollout {entry.rollout_id!r}: call {entry.model_call_id!r} is already stored with another payload; "
                "the rollout is marked incomplete",
            )
        ledger.entries[entry.model_call_id] = canonical
        ledger.version += 1
        return True, ledger.version

    def begin_call(self, rollout_id: str, model_call_id: str, attempt: int) -> int:
        ledger = self._writable(rollout_id, attempt)
        if model_call_id not in ledger.intents:
            ledger.intents[model_call_id] = None
            ledger.version += 1
        return ledger.version

    def mark_incomplete(self, rollout_id: str, model_call_id: str, attempt: int, reason: str = "") -> int:
        ledger = self._writable(rollout_id, attempt, after_freeze=True)
        ledger.lost[model_call_id] = reason or "marked incomplete"
        ledger.version += 1
        return ledger.version

    # --- reads (source) --------------------------------------------------------------

    def freeze(self, rollout_id: str) -> Snapshot:
        ledger = self.rollouts.get(rollout_id)
        if ledger is None:  # never a silent empty snapshot: the trainer may have asked the wrong replica
            raise ApiError(
                ErrorCode.NOT_FOUND,
                f"this policy model replica holds no ledger for rollout {rollout_id!r}: no call of it was "
                "captured here (is this the replica its rollout id hashes to?)",
            )
        if ledger.dropped:
            raise ApiError(ErrorCode.LEDGER_CLOSED, f"rollout {rollout_id!r}: its ledger was retired (dropped)")
        if not ledger.frozen:
            ledger.frozen = True
            ledger.snapshot_id = uuid.uuid4().hex
            ledger.version += 1
        return ledger.snapshot(rollout_id)

    def resolve(self, rollout_id: str, request_items: list) -> Resolution:
        """The stored call these request items continue (:mod:`.ledger_lineage`); read-only."""
        ledger = self.rollouts.get(rollout_id)
        entries = ledger.parsed() if ledger is not None else []
        return ledger_lineage.resolve(entries, request_items)

    def drop(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        ledger = self.rollouts.get(rollout_id)
        if ledger is None or not ledger.frozen or ledger.dropped:
            return False
        if ledger.snapshot_id != snapshot_id or ledger.version != version:
            return False
        ledger.entries.clear()
        ledger.intents.clear()
        ledger.lost.clear()
        ledger.dropped = True
        self._bury(rollout_id)
        return True

    def _bury(self, rollout_id: str) -> None:
        """Keep the tombstone of a dropped rollout among the newest :attr:`tombstones_kept`: a late write of a
        rollout dropped long ago is not refused (it opens a ledger nobody reads) rather than every dropped
        rollout costing memory and a record in every checkpoint forever."""
        self._buried[rollout_id] = None
        self._buried.move_to_end(rollout_id)
        while len(self._buried) > self.tombstones_kept:
            oldest, _ = self._buried.popitem(last=False)
            ledger = self.rollouts.get(oldest)
            if ledger is not None and ledger.dropped:  # a retire or restore may have replaced it since
                del self.rollouts[oldest]

    # --- attempts --------------------------------------------------------------------

    def retire(self, rollout_id: str, attempt: int) -> bool:
        """Attempt ``attempt`` and older are over: their rows go, their late writes are refused."""
        ledger = self.rollouts.get(rollout_id)
        if ledger is None or ledger.attempt > attempt:
            return False
        had_rows = bool(ledger.entries or ledger.intents or ledger.lost)
        self.rollouts[rollout_id] = RolloutLedger(attempt=attempt + 1)
        return had_rows

    # --- checkpoint ------------------------------------------------------------------

    def capture(self, scope: Scope) -> list[FrozenRecord[FrozenLedger]]:
        """Every rollout's records as they are now, encoded later (after resume, in a worker thread): under the
        pause only the lists are copied (an entry is stored as its JSON, which never changes).

        A rollout outside ``scope`` (finished: the controller runs it no more) is still written, its
        ledger waiting for the trainer, but without rollout identity in the manifest: the restore does
        not count it as a live episode. Once the trainer dropped it, it is not written: a finished rollout's
        tombstone only refuses late writes here, and would otherwise add a record to every checkpoint."""
        pending: list[FrozenRecord[FrozenLedger]] = []
        for rollout_id, ledger in sorted(self.rollouts.items()):
            live = scope.includes(rollout_id)
            if ledger.dropped and not live:
                continue
            head = {
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
            frozen = [(ledger_record_key(rollout_id), FrozenLedger(rollout_id, head, []))]
            if ledger.entries:  # a rollout without entries (a retired one's tombstone) has no entries record
                stored = FrozenLedger(rollout_id, None, list(ledger.entries.values()))
                frozen.append((entries_key(rollout_id), stored))
            for key, state in frozen:
                if live:
                    pending.append(FrozenRecord(key, state, rollout_id=rollout_id, attempt=ledger.attempt))
                else:
                    pending.append(FrozenRecord(key, state))
        return pending

    def export(self, scope: Scope) -> list[Record]:
        return [
            Record(p.key, LEDGER_ENCODER.encode(p.state), rollout_id=p.rollout_id, attempt=p.attempt)
            for p in self.capture(scope)
        ]

    @staticmethod
    def validate(records: list[RestoredRecord]) -> dict[str, RolloutLedger]:
        """Parse the checkpoint's ledger records (each rollout's head and entries); each rollout's rows belong
        to attempt + 1."""
        heads = [r for r in records if not r.key.endswith(ENTRIES_SUFFIX)]
        stored = {r.key: r for r in records if r.key.endswith(ENTRIES_SUFFIX)}
        restored: dict[str, RolloutLedger] = {}
        for record in heads:
            payload, inline = _head(record)
            if record.key != ledger_record_key(payload.rollout_id):
                raise InvalidState(f"record {record.key} does not hold the ledger its key names")
            if record.rollout_id is not None and (
                record.rollout_id != payload.rollout_id or record.attempt != payload.attempt
            ):
                raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
            beside = stored.pop(entries_key(payload.rollout_id), None)
            if inline is not None and beside is not None:
                raise InvalidState(f"record {record.key}: a schema 1 ledger record holds its entries itself")
            if inline is None and beside is None and payload.entries:
                raise InvalidState(
                    f"record {record.key}: its entries record {entries_key(payload.rollout_id)} is missing"
                )
            held = LedgerEntries(
                schema_version=LEDGER_RECORD_SCHEMA_VERSION, rollout_id=payload.rollout_id, entries=inline or []
            )
            if beside is not None:
                if (beside.rollout_id, beside.attempt) != (record.rollout_id, record.attempt):
                    raise InvalidState(f"record {beside.key}: manifest identity does not match its head's")
                held = _parse(LedgerEntries, beside)
            if held.rollout_id != payload.rollout_id or len(held.entries) != payload.entries:
                raise InvalidState(
                    f"record {entries_key(payload.rollout_id)}: holds {len(held.entries)} entries of "
                    f"{held.rollout_id!r}, its head names {payload.entries} of {payload.rollout_id!r}"
                )
            entries: dict[str, str] = {}
            for entry in held.entries:
                if entry.rollout_id != payload.rollout_id or entry.model_call_id in entries:
                    raise InvalidState(
                        f"record {entries_key(payload.rollout_id)}: entry {entry.model_call_id!r} is not one of "
                        "this rollout's calls"
                    )
                entries[entry.model_call_id] = entry.canonical()
            restored[payload.rollout_id] = RolloutLedger(
                attempt=payload.attempt + 1,
                entries=entries,
                intents=dict.fromkeys(payload.intents),
                lost=dict(payload.lost),
                frozen=payload.frozen,
                snapshot_id=payload.snapshot_id,
                version=payload.version + 1,  # a snapshot consumed before the restore cannot retire these rows
                dropped=payload.dropped,
            )
        if stored:
            raise InvalidState(f"record {min(stored)} holds ledger entries without their head record")
        return restored

    def install(self, restored: dict[str, RolloutLedger]) -> dict[str, RolloutLedger | None]:
        """Install restored rollouts; returns what they replaced (for :meth:`uninstall`)."""
        replaced = {rollout_id: self.rollouts.get(rollout_id) for rollout_id in restored}
        self.rollouts.update(restored)
        for rollout_id, ledger in restored.items():
            if ledger.dropped:
                self._bury(rollout_id)
        return replaced

    def uninstall(self, restored: dict[str, RolloutLedger], replaced: dict[str, RolloutLedger | None]) -> None:
        for rollout_id, ledger in restored.items():
            if self.rollouts.get(rollout_id) is not ledger:
                continue
            previous = replaced.get(rollout_id)
            if previous is None:
                del self.rollouts[rollout_id]
            else:
                self.rollouts[rollout_id] = previous

    def counts(self) -> dict[str, int]:
        live = [r for r in self.rollouts.values() if not r.dropped]
        return {
            "ledger_rollouts": len(self.rollouts),
            "ledger_retired": len(self.rollouts) - len(live),
            "ledger_entries": sum(len(r.entries) for r in live),
            "ledger_incomplete": sum(1 for r in live if r.lost or r.dangling()),
        }
