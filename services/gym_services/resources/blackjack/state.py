"""Live Blackjack episodes keyed by cookie session id, and their exported form (``docs/participants.md``).

An episode's state is its hands and its shoe's position, ``(seed, draws)``: restoring
rebuilds the shoe and advances it ``draws`` cards, so the next card is the one the
uninterrupted episode would have dealt. Restore checks that replaying the seed deals
exactly the recorded hands, so a tampered or mismatched state is refused, not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.control.participant import InvalidState
from gym_services.resources.blackjack.game import BLACKJACK, MAX_SEED, Episode, Rank, Shoe, hand_value

#: 2: the player's two cards are dealt before the dealer's (version 1 states dealt player, dealer,
#: player, dealer and cannot be restored: their seeds do not deal their hands in this order)
STATE_VERSION = 2
MAX_DRAWS = 64  # hands never get near this: a larger number is a corrupt state, not a long game


class EpisodeState(BaseModel):
    """The exported state of one live episode."""

    model_config = ConfigDict(extra="forbid", strict=True)

    version: Literal[2]
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)]
    draws: Annotated[int, Field(ge=4, le=MAX_DRAWS)]
    player: list[Rank] = Field(min_length=2)
    dealer: list[Rank] = Field(min_length=2, max_length=2)
    steps: Annotated[int, Field(ge=0, le=MAX_DRAWS)]

    @model_validator(mode="after")
    def _consistent(self) -> EpisodeState:
        if self.draws != len(self.player) + len(self.dealer):
            raise ValueError(f"draws {self.draws} != {len(self.player) + len(self.dealer)} cards in the hands")
        if hand_value(list(self.player)) > BLACKJACK:
            raise ValueError("a busted hand is not a live episode")
        if self.steps < len(self.player) - 2:
            raise ValueError(f"{len(self.player) - 2} hits need at least as many steps, got {self.steps}")
        return self

    @classmethod
    def of(cls, episode: Episode) -> dict[str, Any]:
        """A fresh JSON-ready dict (no list shared with the live episode)."""
        return {
            "version": STATE_VERSION,
            "seed": episode.shoe.seed,
            "draws": episode.shoe.draws,
            "player": list(episode.player),
            "dealer": list(episode.dealer),
            "steps": episode.steps,
        }

    def episode(self) -> Episode:
        """The live episode, its shoe advanced to ``draws``."""
        restored = Episode(Shoe.at(self.seed, self.draws), list(self.player), list(self.dealer), self.steps)
        replay = Shoe(self.seed)
        dealt = [replay.deal() for _ in range(self.draws)]
        if dealt != restored.dealt_order():
            raise ValueError(f"seed {self.seed} does not deal these hands")
        return restored


class EpisodeStore:
    """Session id -> episode; the session hooks of an ``exported`` participant."""

    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}

    def start(self, session_id: str, episode: Episode) -> None:
        """A ``/reset`` dealt a new episode (it replaces the session's old one)."""
        self.episodes[session_id] = episode

    def export_session_states(self) -> dict[str, Any]:
        return {sid: EpisodeState.of(episode) for sid, episode in self.episodes.items()}

    def restore_session_states(self, states: dict[str, Any]) -> None:
        """Validate every state first; install them all only when all of them pass."""
        self.install_session_states(self.stage_session_states(states))

    def stage_session_states(self, states: Mapping[str, object]) -> dict[str, Episode]:
        """Every episode rebuilt (nothing installed); :class:`InvalidState` for the first that is not valid."""
        staged: dict[str, Episode] = {}
        for sid, raw in states.items():
            try:
                staged[sid] = EpisodeState.model_validate(raw).episode()
            except ValidationError as exc:
                problem = exc.errors(include_url=False)[0]
                where = ".".join(str(p) for p in problem["loc"]) or "(state)"
                raise InvalidState(f"episode {sid}: {where}: {problem['msg']}") from None
            except ValueError as exc:
                raise InvalidState(f"episode {sid}: {exc}") from None
        return staged

    def install_session_states(self, staged: dict[str, Episode]) -> None:
        self.episodes.update(staged)

    def retire_session_state(self, session_id: str) -> None:
        self.episodes.pop(session_id, None)
