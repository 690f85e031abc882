"""The policy model's checkpoint participant (role ``model``): cuts, holds and prefixes, and the token
ledger (``docs/participants.md``, ``docs/protocol.md`` "The token ledger")."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, cast

from gym_services.control.participant import Capture, FrozenRecord, Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.policy_model.generations import GenerationManager
from gym_services.models.policy_model.ledger.records import (
    LEDGER_ENCODER,
    FrozenLedgerRecord,
    entry_sequence,
    frozen_records,
    is_ledger_record,
    parse_records,
)
from gym_services.models.policy_model.ledger.rollouts import RolloutLedger, TokenLedger
from gym_services.models.policy_model.prefixes import Frozen as FrozenGeneration
from gym_services.models.policy_model.prefixes import Key, StagedPrefix, freeze
from gym_services.models.policy_model.prefixes import encode as encode_generation

#: the state of the model participant's frozen records
Frozen = FrozenLedgerRecord | FrozenGeneration


class ModelEncoder:
    """Makes the bytes of the model participant's frozen records: a ledger head or chunk, a prompt or a prefix."""

    def encode(self, state: Frozen) -> bytes:
        if isinstance(state, FrozenLedgerRecord):
            return LEDGER_ENCODER.encode(state)
        return encode_generation(state)

    def encoded(self, state: Frozen, data: bytes) -> None:
        pass


MODEL_ENCODER = ModelEncoder()


def captured(
    ledger: TokenLedger, generations: list[tuple[Key, StagedPrefix]], scope: Scope
) -> list[FrozenRecord[Frozen]]:
    """The model participant's frozen records: each generation's prompt record (written against its rollout's last
    ledger entry), chunks and head, and the ledgers. Records that keep their bytes from one checkpoint to the next
    (ledger chunks and first prompts, prompts, generation chunks) come first, those that change (ledger heads,
    generation heads) last: packs fill in this order, so the records a later checkpoint references share packs with
    few it does not."""
    prompts: list[FrozenRecord[Frozen]] = []
    prefixes: list[FrozenRecord[Frozen]] = []
    for (rollout_id, digest), prefix in generations:
        rows = ledger.rollouts.get(rollout_id)
        base = tuple(rows.entries.stored) if rows is not None else ()
        for state in freeze(rollout_id, digest, prefix, base):
            kept = prompts if state.lasting else prefixes
            kept.append(FrozenRecord(state.key, state, rollout_id=rollout_id, attempt=prefix.attempt))
    ledgers = frozen_records(ledger, scope)
    chunks = cast(list[FrozenRecord[Frozen]], [r for r in ledgers if r.state.lasting])
    heads = cast(list[FrozenRecord[Frozen]], [r for r in ledgers if not r.state.lasting])
    return [*chunks, *prompts, *heads, *prefixes]


@dataclass
class Restored:
    """What a restore installs: staged prefixes, and each rollout's ledger under attempt + 1."""

    prefixes: dict[Key, StagedPrefix]
    ledgers: dict[str, RolloutLedger]
    replaced: dict[str, RolloutLedger | None] = field(default_factory=dict)


class ModelParticipant(Participant[Restored, Frozen]):
    """prepare holds (no stream starts, a finished response waits for resume); capture takes each running
    generation's prefix as far as it has streamed, and the ledgers, while the streams go on (a final checkpoint cuts
    them first); resume and abort deliver what was held and start what waited."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.EXPORTED
    checkpoint_verify = VerifyMode.WAIT
    encoder = MODEL_ENCODER  # ledgers and prefixes are captured frozen and encoded after resume

    def __init__(self, manager: GenerationManager, ledger: TokenLedger) -> None:
        self.manager = manager
        self.ledger = ledger

    async def prepare(self, checkpoint_id: str) -> None:
        self.manager.hold()  # the running generations go on until the capture cuts them: nothing blocks

    async def export(self, scope: Scope) -> list[Record]:
        captured = await self.capture(scope)
        return [
            Record(r.key, MODEL_ENCODER.encode(r.state), r.rollout_id, r.attempt) if isinstance(r, FrozenRecord) else r
            for r in captured.records
        ]

    async def capture(self, scope: Scope) -> Capture[Frozen]:
        """Ledgers and generations frozen now (lists sliced) and encoded after resume (:func:`captured`): a running
        generation as far as it has streamed, its stream going on (``docs/decisions.md``, "A checkpoint the model
        resumes from never stops its streams"); a final checkpoint's capture cuts the streams first, so its
        prefixes hold every token the upstream generated."""
        if scope.final:
            await self.manager.cut()
        return Capture(captured(self.ledger, self.manager.export(scope), scope))

    async def release_out_of_scope(self, scope: Scope) -> None:
        self.manager.release_out_of_scope(scope)  # ledgers stay: the trainer drops them once consumed

    async def validate(self, records: list[RestoredRecord]) -> Restored:
        ledgers = parse_records([r for r in records if is_ledger_record(r.key)])

        def base(rollout_id: str, index: int) -> array[int]:
            return entry_sequence(ledgers[rollout_id], index)

        prefixes = self.manager.validate([r for r in records if not is_ledger_record(r.key)], base)
        return Restored(prefixes=prefixes, ledgers=ledgers)

    async def install(self, validated: Restored) -> None:
        self.manager.install(validated.prefixes)
        validated.replaced = self.ledger.install(validated.ledgers)

    async def uninstall(self, validated: Restored) -> None:
        self.manager.uninstall(validated.prefixes)
        self.ledger.uninstall(validated.ledgers, validated.replaced)

    async def resume(self) -> None:
        self.manager.resume()

    async def abort(self) -> None:
        self.manager.resume()

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        dropped_rows = self.ledger.retire(rollout_id, attempt)
        return await self.manager.retire(rollout_id, attempt) or dropped_rows

    def live(self) -> dict[str, Any]:
        return {**self.manager.live_counts(), **self.ledger.counts()}
