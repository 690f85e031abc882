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

Memory and back-pressure: entries are held in their stored form (:mod:`.entries`: each call's new tokens, 4
bytes per id and per log-prob, and its output items). A rollout is held until the trainer drops it, however
long that takes, so what a slow trainer leaves behind is bounded: once the ledger holds more than ``max_bytes``,
a call that would open a new rollout waits (:meth:`TokenLedger.room_for`) until drops or retires free room,
while the rollouts already held go on; so the ledger, and the checkpoint that writes it, stay within
``max_bytes`` plus what the live rollouts add.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.tokens import Tokens
from gym_services.models.policy_model.ledger.entries import EntryLog
from gym_services.models.policy_model.ledger.lineage import resolve as resolve_lineage
from gym_services.models.policy_model.ledger.wire import FrozenRollout, LedgerEntry, Resolution

#: the reason of a call begun (an intent) and never stored
NEVER_STORED = "begun and never stored"
#: dropped rollouts remembered (their late writes refused), the newest drops; an older one is forgotten
DROPPED_KEPT = 4096
#: the stored bytes the ledger holds before a new rollout waits for room (the policy model's ``ledger.max_bytes``)
DEFAULT_MAX_BYTES = 2 * 1024**3


@dataclass(slots=True)
class RolloutLedger:
    """One rollout's rows for one attempt."""

    attempt: int
    #: the entries in their stored form (a read decodes them)
    entries: EntryLog = field(default_factory=EntryLog)
    #: where the entries' checkpoint chunks start (:mod:`.records`), and how many entries they cover
    chunks: list[int] = field(default_factory=list)
    chunked: int = 0
    intents: dict[str, None] = field(default_factory=dict)
    #: call ids marked lost ("" when the caller did not know which call)
    lost: dict[str, str] = field(default_factory=dict)
    frozen: bool = False
    #: NeMo Gym's id of the freeze ("" until frozen)
    snapshot_id: str = ""
    version: int = 0
    dropped: bool = False

    def parsed(self) -> list[LedgerEntry]:
        return self.entries.entries()

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

    def __init__(self, dropped_kept: int = DROPPED_KEPT, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.rollouts: dict[str, RolloutLedger] = {}
        self.dropped_kept = dropped_kept
        self.max_bytes = max_bytes
        #: the stored bytes of every rollout's entries
        self.held = 0
        #: calls waiting for room now, and how many waited so far
        self.waiting = 0
        self.waited = 0
        self._room: asyncio.Event | None = None
        #: the rollouts dropped (each still in :attr:`rollouts`, with no rows), oldest first
        self._drop_order: OrderedDict[str, None] = OrderedDict()

    def _replace(self, rollout_id: str, ledger: RolloutLedger | None) -> None:
        """Put ``ledger`` in place of the rollout's (None: remove it), keeping :attr:`held` up to date."""
        old = self.rollouts.get(rollout_id)
        if old is not None:
            self.held -= old.entries.nbytes
        if ledger is None:
            self.rollouts.pop(rollout_id, None)
        else:
            self.rollouts[rollout_id] = ledger
            self.held += ledger.entries.nbytes
        if old is not None and self._room is not None and self.held <= self.max_bytes:
            self._room.set()

    # --- back-pressure ---------------------------------------------------------------

    def full(self) -> bool:
        return self.held > self.max_bytes

    async def room_for(self, rollout_id: str, wait_s: float) -> None:
        """Return once the ledger may open ``rollout_id``: at once for a rollout it holds, or while it holds at
        most ``max_bytes``; else wait for drops and retires to free room, up to ``wait_s`` (then ``503
        not_ready``: the caller backs off and calls again)."""
        if rollout_id in self.rollouts or not self.full():
            return
        deadline = time.monotonic() + wait_s
        self.waiting += 1
        self.waited += 1
        try:
            while self.full() and rollout_id not in self.rollouts:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiError(
                        ErrorCode.NOT_READY,
                        f"the token ledger holds {self.held} bytes of rollouts no trainer has dropped yet "
                        f"(ledger.max_bytes {self.max_bytes}): a new rollout waits until the trainer drops "
                        "the ones it read",
                    )
                if self._room is None or self._room.is_set():
                    self._room = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), min(left, 1.0))
        finally:
            self.waiting -= 1

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
            ledger = RolloutLedger(attempt=attempt)
            self._replace(rollout_id, ledger)
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
        existing = ledger.entries.index(entry.model_call_id)
        if existing is not None:
            if ledger.entries.same(existing, entry):
                return False, ledger.version
            ledger.lost.setdefault(entry.model_call_id, "conflicting payloads for one call id")
            ledger.version += 1
            raise ApiError(
                ErrorCode.LEDGER_CONFLICT,
                f"rollout {entry.rollout_id!r}: call {entry.model_call_id!r} is already stored with another payload; "
                "the rollout is marked incomplete",
            )
        before = ledger.entries.nbytes
        ledger.entries.append(entry)
        self.held += ledger.entries.nbytes - before
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

    def tokens(self, rollout_id: str, model_call_ids: list[str]) -> list[Tokens]:
        """The stored tokens of these calls, in this order (a read: nothing changes, frozen or not)."""
        ledger = self.rollouts.get(rollout_id)
        if ledger is None or ledger.dropped:
            raise ApiError(ErrorCode.NOT_FOUND, f"this policy model replica holds no ledger for rollout {rollout_id!r}")
        indices = [ledger.entries.index(call) for call in model_call_ids]
        missing = [call for call, index in zip(model_call_ids, indices, strict=True) if index is None]
        if missing:
            raise ApiError(
                ErrorCode.NOT_FOUND,
                f"rollout {rollout_id!r}: the ledger holds no call {missing[0]!r}",
                details={"missing": missing},
            )
        found = dict(ledger.entries.tokens(i for i in indices if i is not None))
        return [found[i] for i in indices if i is not None]

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
        gone = RolloutLedger(
            attempt=ledger.attempt, frozen=True, snapshot_id=ledger.snapshot_id, version=ledger.version, dropped=True
        )
        self._replace(rollout_id, gone)
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
                self._replace(oldest, None)

    # --- attempts --------------------------------------------------------------------

    def retire(self, rollout_id: str, attempt: int) -> bool:
        """Attempt ``attempt`` and older are over: their rows go, their late writes are refused."""
        ledger = self.rollouts.get(rollout_id)
        if ledger is None or ledger.attempt > attempt:
            return False
        had_rows = bool(ledger.entries or ledger.intents or ledger.lost)
        self._replace(rollout_id, RolloutLedger(attempt=attempt + 1))
        return had_rows

    # --- restore ---------------------------------------------------------------------

    def install(self, restored: dict[str, RolloutLedger]) -> dict[str, RolloutLedger | None]:
        """Install restored rollouts (:func:`.records.parse_records`); returns what they replaced (for
        :meth:`uninstall`)."""
        replaced = {rollout_id: self.rollouts.get(rollout_id) for rollout_id in restored}
        for rollout_id, ledger in restored.items():
            self._replace(rollout_id, ledger)
            if ledger.dropped:
                self._remember_dropped(rollout_id)
        return replaced

    def uninstall(self, restored: dict[str, RolloutLedger], replaced: dict[str, RolloutLedger | None]) -> None:
        for rollout_id, ledger in restored.items():
            if self.rollouts.get(rollout_id) is not ledger:
                continue
            self._replace(rollout_id, replaced.get(rollout_id))

    def counts(self) -> dict[str, int]:
        live = [r for r in self.rollouts.values() if not r.dropped]
        return {
            "ledger_rollouts": len(self.rollouts),
            "ledger_retired": len(self.rollouts) - len(live),
            "ledger_entries": sum(len(r.entries) for r in live),
            "ledger_incomplete": sum(1 for r in live if r.lost or r.dangling()),
            "ledger_bytes": self.held,
            "ledger_waiting": self.waiting,
            "ledger_waited": self.waited,
        }
