"""The policy model's checkpoint participant (role ``model``): cuts, holds and prefixes (``docs/participants.md``)."""

from __future__ import annotations

from typing import Any

from gym_services.control.models import Blocker
from gym_services.control.participant import Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.policy_model.generations import GenerationManager, Key
from gym_services.models.policy_model.prefixes import StagedPrefix


class ModelParticipant(Participant):
    """prepare cuts every in-flight generation; capture takes prefixes; resume and abort continue them."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.EXPORTED
    checkpoint_verify = VerifyMode.WAIT

    def __init__(self, manager: GenerationManager) -> None:
        self.manager = manager

    async def prepare(self, checkpoint_id: str) -> None:
        self.manager.pause()

    def blockers(self) -> list[Blocker]:
        return self.manager.blockers()

    async def export(self, scope: Scope) -> list[Record]:
        return self.manager.export(scope)

    async def release_out_of_scope(self, scope: Scope) -> None:
        self.manager.release_out_of_scope(scope)

    async def validate(self, records: list[RestoredRecord]) -> dict[Key, StagedPrefix]:
        return self.manager.validate(records)

    async def install(self, validated: dict[Key, StagedPrefix]) -> None:
        self.manager.install(validated)

    async def uninstall(self, validated: dict[Key, StagedPrefix]) -> None:
        self.manager.uninstall(validated)

    async def resume(self) -> None:
        self.manager.resume()

    async def abort(self) -> None:
        self.manager.resume()

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        return await self.manager.retire(rollout_id, attempt)

    def live(self) -> dict[str, Any]:
        return self.manager.live_counts()
