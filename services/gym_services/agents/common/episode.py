"""One attempt of one rollout in an agent: its boundary, the step it is in, its tokens and what its checkpoints
hold of it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.context import InFlight
from gym_services.agents.common.records import EpisodeLog
from gym_services.agents.common.tokens import EpisodeTokens
from gym_services.base.identity import RolloutIdentity


@dataclass(eq=False)
class Episode:
    """One attempt of one rollout in this agent."""

    rollout_id: str
    attempt: int
    boundary: Boundary
    anonymous: bool = False
    restored: bool = False
    task: asyncio.Task[dict[str, Any]] | None = None
    step: str | None = None
    waited: bool = False
    parked: bool = False
    history: list[str] = field(default_factory=list)
    #: every token triple its boundaries hold (they hold the table's arrays), and what its checkpoints hold of it
    tokens: EpisodeTokens = field(default_factory=EpisodeTokens)
    log: EpisodeLog = field(default_factory=EpisodeLog)

    def __post_init__(self) -> None:
        self.tokens.intern(list(self.boundary.__dict__.values()))

    in_flight: InFlight = field(default_factory=InFlight)  # the downstream call of its step running now

    @property
    def identity(self) -> RolloutIdentity | None:
        """What travels downstream; anonymous episodes (checkpointing off, no id) send none."""
        return None if self.anonymous else RolloutIdentity(rollout_id=self.rollout_id, attempt=self.attempt)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def enter(self, step: str, waited: bool) -> None:
        self.step, self.waited = step, waited

    def leave(self) -> None:
        self.step, self.waited = None, False

    def record(self, boundary: Boundary) -> None:
        """Record the boundary before the next step (this also ends the current step); its token lists become the
        episode's arrays (it is a fresh boundary: nothing else holds its containers)."""
        self.tokens.intern(list(boundary.__dict__.values()))
        self.boundary = boundary
        self.history.append(boundary.name)
        self.leave()
