"""What each agent implements: its boundary type, its first boundary, and one step.

An agent's episode is a state machine over boundaries. :meth:`AgentLoop.advance`
performs exactly one step from a boundary (one downstream call with effects) and
returns the next boundary; it must not mutate the boundary it is given, so the
runner can go back to it and retry after a ``409 checkpoint_parked``. Continuing a
restored episode is the same code path as running a fresh one: start from the boundary.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from gym_services.agents.common.boundary import Boundary

if TYPE_CHECKING:
    from gym_services.agents.common.context import StepContext


class StepKind(enum.StrEnum):
    """Replay steps (seed, generation, ``replay`` verification) do not block prepare; waited ones do."""

    REPLAY = "replay"
    WAITED = "waited"


class AgentLoop(ABC):
    """One agent's episode loop."""

    #: the agent kind written into records; a record of another kind is refused at restore
    kind: ClassVar[str]
    boundary_model: ClassVar[type[Boundary]] = Boundary

    @abstractmethod
    def initial(self, row: dict[str, Any]) -> Boundary:
        """The first boundary of a fresh episode for this task row."""

    @abstractmethod
    def step_kind(self, boundary: Boundary) -> StepKind:
        """Whether the step after ``boundary`` is a replay step or a waited step."""

    @abstractmethod
    async def advance(self, ctx: StepContext, boundary: Boundary) -> Boundary:
        """Run the one step after ``boundary`` and return the boundary that follows it."""

    async def on_error(self, ctx: StepContext, boundary: Boundary, error: Exception) -> None:  # noqa: B027 - optional hook
        """The episode failed in the step after ``boundary``: best-effort cleanup (the error still ends it)."""
