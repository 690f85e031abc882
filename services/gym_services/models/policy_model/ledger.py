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
  false. A dropped rollout keeps a tombstone, so a late write is still refused.

Attempts: every write carries the rollout's attempt. The ledger belongs to one attempt of a rollout; a
write from an older one is refused (``409 stale_attempt``); a write from a newer one raises the
ledger's attempt (a retire, not a write, removes a retired attempt's rows). In a checkpoint the ledger
is one record per rollout (:class:`LedgerRecord`); a restore installs its rows under attempt + 1, so
attempt N is retired: its late writes are refused.
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
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.participant import FrozenRecord, InvalidState, Record, RestoredRecord, Scope
from gym_services.models.policy_model import ledger_lineage
from gym_services.models.policy_model.ledger_wire import ROLLOUT_ID, LedgerEntry, Resolution, Snapshot

LEDGER_RECORD_SCHEMA_VERSION = 1
RECORD_PREFIX = "ledger-"
#: the reason of a call begun (an intent) and never stored
NEVER_STORED = "begun and never stored"


@dataclass
class RolloutLedger:
    """One rollout's rows for one attempt."""

    attempt: int
    #: call id -> (canonical JSON, entry)
    entries: dict[str, tuple[str, LedgerEntry]] = field(default_factory=dict)
    intents: dict[str, None] = field(default_factory=dict)
    #: call ids marked lost ("" when the caller did not know which call)
    lost: dict[str, str] = field(default_factory=dict)
    frozen: bool = False
    snapshot_id: str = ""
    version: int = 0
    dropped: bool = False

    def dangling(self) -> list[str]:
        return [c for c in self.intents if c not in self.entries]

    def snapshot(self, rollout_id: str) -> Snapshot:
        lost = {**{call: NEVER_STORED for call in self.dangling()}, **self.lost}
        return Snapshot(
            rollout_id=rollout_id,
            attempt=self.attempt,
            entries=[entry for _, entry in self.entries.values()],
            incomplete=bool(lost),
            snapshot_id=self.snapshot_id,
            version=self.version,
            lost_calls=lost,
        )


class LedgerRecord(BaseModel):
    """A rollout's ledger in a checkpoint (``docs/protocol.md``, "The capture ledger")."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
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
class FrozenLedger:
    """One rollout's ledger as a capture froze it: its head fields and its entries' stored JSON."""

    head: dict[str, Any]
    entries: list[str]


class LedgerEncoder:
    """The policy model participant's :class:`~gym_services.control.participant.RecordEncoder`: a
    :class:`LedgerRecord`'s JSON, the entries spliced in as stored (each already its JSON)."""

    def encode(self, state: FrozenLedger) -> bytes:
        text = json.dumps(state.head, ensure_ascii=False, separators=(",", ":"))
        return f'{text[:-1]},"entries":[{",".join(state.entries)}]}}'.encode()

    def encoded(self, state: FrozenLedger, data: bytes) -> None:
        pass


LEDGER_ENCODER = LedgerEncoder()


def ledger_record_key(rollout_id: str) -> str:
    return RECORD_PREFIX + hashlib.sha256(rollout_id.encode()).hexdigest()


def is_ledger_record(key: str) -> bool:
    return key.startswith(RECORD_PREFIX)


class CaptureLedger:
    """Every rollout's ledger on this replica."""

    def __init__(self) -> None:
        self.rollouts: dict[str, RolloutLedger] = {}

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
            if existing[0] == canonical:
                return False, ledger.version
            ledger.lost.setdefault(entry.model_call_id, "conflicting payloads for one call id")
            ledger.version += 1
            raise ApiError(
                ErrorCode.LEDGER_CONFLICT,
                f"rollout {entry.rollout_id!r}: call {entry.model_call_id!r} is already stored with another payload; "
                "the rollout is marked incomplete",
            )
        ledger.entries[entry.model_call_id] = (canonical, entry)  # the caller's: routes and capture build it afresh
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
        entries = [entry for _, entry in ledger.entries.values()] if ledger is not None else []
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
        return True

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
        """Every rollout's record as it is now, encoded later (after resume, in a worker thread): under the
        pause only the lists are copied (an entry is stored as its JSON, which never changes).

        A rollout outside ``scope`` (finished: the controller runs it no more) is still written, its
        ledger waiting for the trainer, but without rollout identity in the manifest: the restore does
        not count it as a live episode."""
        pending: list[FrozenRecord[FrozenLedger]] = []
        for rollout_id, ledger in sorted(self.rollouts.items()):
            live = scope.includes(rollout_id)
            head = {
                "schema_version": LEDGER_RECORD_SCHEMA_VERSION,
                "rollout_id": rollout_id,
                "attempt": ledger.attempt,
                "intents": list(ledger.intents),
                "lost": dict(ledger.lost),
                "frozen": ledger.frozen,
                "snapshot_id": ledger.snapshot_id,
                "version": ledger.version,
                "dropped": ledger.dropped,
            }
            key = ledger_record_key(rollout_id)
            frozen = FrozenLedger(head, [canonical for canonical, _ in ledger.entries.values()])
            if live:
                pending.append(FrozenRecord(key, frozen, rollout_id=rollout_id, attempt=ledger.attempt))
            else:
                pending.append(FrozenRecord(key, frozen))
        return pending

    def export(self, scope: Scope) -> list[Record]:
        return [
            Record(p.key, LEDGER_ENCODER.encode(p.state), rollout_id=p.rollout_id, attempt=p.attempt)
            for p in self.capture(scope)
        ]

    @staticmethod
    def validate(records: list[RestoredRecord]) -> dict[str, RolloutLedger]:
        """Parse the checkpoint's ledger records; each rollout's rows belong to attempt + 1."""
        restored: dict[str, RolloutLedger] = {}
        for record in records:
            try:
                payload = LedgerRecord.model_validate_json(record.data)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
                )
                raise InvalidState(f"record {record.key} is not a ledger record: {problems}") from None
            if payload.schema_version != LEDGER_RECORD_SCHEMA_VERSION:
                raise InvalidState(
                    f"record {record.key}: ledger schema_version {payload.schema_version} is not supported"
                )
            if record.key != ledger_record_key(payload.rollout_id):
                raise InvalidState(f"record {record.key} does not hold the ledger its key names")
            if record.rollout_id is not None and (
                record.rollout_id != payload.rollout_id or record.attempt != payload.attempt
            ):
                raise InvalidState(f"record {record.key}: manifest identity does not match the record's")
            entries: dict[str, tuple[str, LedgerEntry]] = {}
            for entry in payload.entries:
                if entry.rollout_id != payload.rollout_id or entry.model_call_id in entries:
                    raise InvalidState(
                        f"record {record.key}: entry {entry.model_call_id!r} is not one of this rollout's calls"
                    )
                entries[entry.model_call_id] = (entry.canonical(), entry)
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
        return restored

    def install(self, restored: dict[str, RolloutLedger]) -> dict[str, RolloutLedger | None]:
        """Install restored rollouts; returns what they replaced (for :meth:`uninstall`)."""
        replaced = {rollout_id: self.rollouts.get(rollout_id) for rollout_id in restored}
        self.rollouts.update(restored)
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
