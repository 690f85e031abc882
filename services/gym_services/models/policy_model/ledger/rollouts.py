"""The token ledger: each rollout's training tokens, one entry per model call (``docs/decisions.md``,
"The token ledger lives with the rollout's policy model replica").

It keeps NeMo Gym 0.7.0's ``token_id_capture`` contracts (``TokenSink``, ``TokenSource`` in
``nemo_gym/token_id_capture/protocols.py``) for the rollouts this replica serves:

- ``put`` stores an entry; once it returns (the route answered) every later read sees it. A retry of
  the same payload is a no-op; another payload under the same call id is refused (``409
  ledger_conflict``) and masks the rollout;
- ``begin_call`` records an intent before a call is dispatched; an intent without an entry at freeze
  masks the rollout (the call was lost);
- ``mark_incomplete`` records a lost call; it works after freeze too and moves the version;
- ``freeze`` stops writes (``409 ledger_closed``) and returns the frozen rollout (its entries,
  ``incomplete``, and NeMo Gym's ``snapshot_id`` and ``version`` naming this freeze); freezing again
  returns the same;
- ``resolve`` names the stored call a request continues, or none (lineage, :mod:`.lineage`);
- ``drop`` retires exactly a consumed freeze: with another version it changes nothing and answers
  false. A dropped rollout is remembered as dropped (no rows), so a late write is still refused: the
  newest :data:`DROPPED_KEPT` of them, in memory only (a checkpoint writes a dropped rollout still in
  its scope, never a finished one), so dropped rollouts cost a bounded amount however many there were.

Attempts: every write carries the rollout's attempt. The ledger belongs to one attempt of a rollout; a
write from an older one is refused (``409 stale_attempt``); a write from a newer one raises the
ledger's attempt (a retire, not a write, removes a retired attempt's rows). The checkpoint records of
the ledger (two per rollout, its head and its entries) are :mod:`.records`'; a restore installs their
rows under attempt + 1 (:meth:`TokenLedger.install`). Intents travel with the rows: a call in flight at
the checkpoint whose re-issue never completes leaves its intent dangling, and the rollout freezes
incomplete instead of being trained on with a hole.

Durability: the ledger is held in the replica's memory and made durable by the checkpoint (the model
participant's records). What a replica held after its last checkpoint dies with it, together with the
attempt that wrote it: a restore resumes the rollout as attempt + 1 from the checkpoint's rows.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.models.policy_model.ledger.lineage import resolve as resolve_lineage
from gym_services.models.policy_model.ledger.wire import FrozenRollout, LedgerEntry, Resolution

#: the reason of a call begun (an intent) and never stored
NEVER_STORED = "begun and never stored"
#: dropped rollouts remembered (their late writes refused), the newest drops; an older one is forgotten
DROPPED_KEPT = 4096


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
    #: NeMo Gym's id of the freeze ("" until frozen)
    snapshot_id: str = ""
    version: int = 0
    dropped: bool = False

    def parsed(self) -> list[LedgerEntry]:
        return [LedgerEntry.model_validate_json(canonical) for canonical in self.entries.values()]

    def dangling(self) -> list[str]:
        return [c for c in self.intents if c not in self.entries]

    def read(self, rollout_id: str) -> FrozenRollout:
        lost = {**{call: NEVER_STORED for call in self.dangling()}, **self.lost}
        return FrozenRollout(
            rollout_id=rollout_id,
            attempt=self.attempt,
            entries=self.parsed(),
            incomplete=bool(lost),
            snapshot_id=self.snapshot_id,
            version=self.version,
            lost_calls=lost,
        )


class TokenLedger:
    """Every rollout's ledger on this replica."""

    def __init__(self, dropped_kept: int = DROPPED_KEPT) -> None:
        self.rollouts: dict[str, RolloutLedger] = {}
        self.dropped_kept = dropped_kept
        #: the rollouts dropped (each still in :attr:`rollouts`, with no rows), oldest first
        self._drop_order: OrderedDict[str, None] = OrderedDict()

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
                ErrorCode.LEDGER_CLOSED, f"rollout {rollout_id!r}: its ledger is frozen (freeze {ledger.snapshot_id})"
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

    def freeze(self, rollout_id: str) -> FrozenRollout:
        ledger = self.rollouts.get(rollout_id)
        if ledger is None:  # never a silent empty answer: the trainer may have asked the wrong replica
            raise ApiError(
                ErrorCode.NOT_FOUND,
                f"this policy model replica holds no ledger for rollout {rollout_id!r}: no call of it was "
                "recorded here (is this the replica its rollout id hashes to?)",
            )
        if ledger.dropped:
            raise ApiError(ErrorCode.LEDGER_CLOSED, f"rollout {rollout_id!r}: its ledger was retired (dropped)")
        if not ledger.frozen:
            ledger.frozen = True
            ledger.snapshot_id = uuid.uuid4().hex
            ledger.version += 1
        return ledger.read(rollout_id)

    def resolve(self, rollout_id: str, request_items: list[Any]) -> Resolution:
        """The stored call these request items continue (:mod:`.lineage`); read-only."""
        ledger = self.rollouts.get(rollout_id)
        entries = ledger.parsed() if ledger is not None else []
        return resolve_lineage(entries, request_items)

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
        self._remember_dropped(rollout_id)
        return True

    def _remember_dropped(self, rollout_id: str) -> None:
        """Keep a dropped rollout among the newest :attr:`dropped_kept`: a late write of a rollout dropped long
        ago is not refused (it opens a ledger nobody reads) rather than every dropped rollout costing memory
        and a record in every checkpoint forever."""
        self._drop_order[rollout_id] = None
        self._drop_order.move_to_end(rollout_id)
        while len(self._drop_order) > self.dropped_kept:
            oldest, _ = self._drop_order.popitem(last=False)
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

    # --- restore ---------------------------------------------------------------------

    def install(self, restored: dict[str, RolloutLedger]) -> dict[str, RolloutLedger | None]:
        """Install restored rollouts (:func:`.records.parse_records`); returns what they replaced (for
        :meth:`uninstall`)."""
        replaced = {rollout_id: self.rollouts.get(rollout_id) for rollout_id in restored}
        self.rollouts.update(restored)
        for rollout_id, ledger in restored.items():
            if ledger.dropped:
                self._remember_dropped(rollout_id)
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
