"""The policy model's checkpoint participant (role ``model``): cuts, holds and prefixes, and the token
ledger (``docs/participants.md``, ``docs/protocol.md`` "The token ledger")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gym_services.control.models import Blocker
from gym_services.control.participant import Capture, Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.policy_model.generations import GenerationManager, Key
from gym_services.models.policy_model.ledger.records import (
    LEDGER_ENCODER,
    FrozenLedgerRecord,
    encoded_records,
    frozen_records,
    is_ledger_record,
    parse_records,
)
from gym_services.models.policy_model.ledger.rollouts import RolloutLedger, TokenLedger
from gym_services.models.policy_model.prefixes import StagedPrefix


@dataclass
class Restored:
    """What a restore installs: staged prefixes, and each rollout's ledger under attempt + 1."""

    prefixes: dict[Key, StagedPrefix]
    ledgers: dict[str, RolloutLedger]
    replaced: dict[str, RolloutLedger | None] = field(default_factory=dict)


class ModelParticipant(Participant[Restored, FrozenLedgerRecord]):
    """prepare cuts every in-flight generation; capture takes prefixes and ledgers; resume and abort continue them."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.EXPORTED
    checkpoint_verify = VerifyMode.WAIT
    encoder = LEDGER_ENCODER  # ledgers are captured frozen and encoded after resume

    def __init__(self, manager: GenerationManager, ledger: TokenLedger) -> None:
        self.manager = manager
        self.ledger = ledger

    async def prepare(self, checkpoint_id: str) -> None:
        self.manager.pause()

    def blockers(self) -> list[Blocker]:
        return self.manager.blockers()

    async def export(self, scope: Scope) -> list[Record]:
        return self.manager.export(scope) + encoded_records(self.ledger, scope)

    async def capture(self, scope: Scope) -> Capture[FrozenLedgerRecord]:
        """Prefixes encoded now (few, small); ledgers, which grow with every call's tokens, after resume."""
        return Capture([*self.manager.export(scope), *frozen_records(self.ledger, scope)])

    async def release_out_of_scope(self, scope: Scope) -> None:
        self.manager.release_out_of_scope(scope)  # ledgers stay: the trainer drops them once consumed

    async def validate(self, records: list[RestoredRecord]) -> Restored:
        return Restored(
            prefixes=self.manager.validate([r for r in records if not is_ledger_record(r.key)]),
            ledgers=parse_records([r for r in records if is_ledger_record(r.key)]),
        )

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
