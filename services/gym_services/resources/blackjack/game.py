"""Blackjack rules, cards and text, with no HTTP in sight (see the README).

The game is NeMo Gym's ``resources_servers/blackjack``: an infinite shoe (every card drawn
uniformly from the 13 ranks with ``random.Random.choice``), the player's two cards dealt first,
then the dealer's two; the first ``<action>hit|stand</action>`` of the model's text decides
(anything else stands); the dealer draws to 17 (standing on a soft 17); a finished game has no
observation. The shoe is a seeded ``random.Random`` plus the number of cards drawn so far, so
its position is two integers: a shoe rebuilt from ``(seed, draws)`` deals exactly the cards an
uninterrupted one would, and the same generator deals the same game as the reference's.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Rank = Literal["2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A"]
RANKS: tuple[Rank, ...] = get_args(Rank)
DEALER_STANDS_AT = 17
BLACKJACK = 21
MAX_SEED = 2**64 - 1
PROMPT = "Respond with <action>hit</action> or <action>stand</action>."

Action = Literal["hit", "stand"]
_ACTION = re.compile(r"<action>\s*(hit|stand)\s*</action>", re.IGNORECASE)


class Shoe:
    """A seeded infinite shoe whose whole state is ``(seed, draws)``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.draws = 0
        self._rng = random.Random(seed)

    @classmethod
    def at(cls, seed: int, draws: int) -> Shoe:
        """The shoe of ``seed`` after ``draws`` cards: the next card is the one an uninterrupted shoe deals."""
        shoe = cls(seed)
        for _ in range(draws):
            shoe.deal()
        return shoe

    def deal(self) -> str:
        self.draws += 1
        return self._rng.choice(RANKS)


def card_value(rank: str) -> int:
    if rank == "A":
        return 11
    if rank in ("J", "Q", "K"):
        return 10
    return int(rank)


def hand_value(cards: list[str]) -> int:
    """Aces count 11 until that would bust the hand, then 1."""
    total = sum(card_value(c) for c in cards)
    aces = cards.count("A")
    while total > BLACKJACK and aces:
        total -= 10
        aces -= 1
    return total


def show(cards: list[str]) -> str:
    return "[" + ", ".join(cards) + "]"


def parse_action(text: str) -> Action:
    """The first ``<action>hit|stand</action>`` in ``text`` (any case, spaces inside); else ``stand``."""
    found = _ACTION.search(text or "")
    return "hit" if found and found.group(1).lower() == "hit" else "stand"


@dataclass
class StepResult:
    observation: str | None
    reward: float
    terminated: bool
    info: dict[str, Any]


@dataclass
class Episode:
    """One game: the shoe, both hands, and how many steps were taken."""

    shoe: Shoe
    player: list[str] = field(default_factory=list)
    dealer: list[str] = field(default_factory=list)
    steps: int = 0

    @classmethod
    def deal(cls, seed: int) -> Episode:
        """The player's two cards, then the dealer's two (the reference's order)."""
        episode = cls(Shoe(seed))
        episode.player = [episode.shoe.deal(), episode.shoe.deal()]
        episode.dealer = [episode.shoe.deal(), episode.shoe.deal()]
        return episode

    def observation(self) -> str:
        return f"Your hand: {show(self.player)} = {hand_value(self.player)}\nDealer shows: {self.dealer[0]}\n{PROMPT}"

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        if action == "hit":
            self.player.append(self.shoe.deal())
            value = hand_value(self.player)
            if value > BLACKJACK:
                info = {"result": "bust", "player": show(self.player), "value": value}
                return StepResult(None, -1.0, True, info)
            return StepResult(self.observation(), 0.0, False, {})
        while hand_value(self.dealer) < DEALER_STANDS_AT:
            self.dealer.append(self.shoe.deal())
        mine, theirs = hand_value(self.player), hand_value(self.dealer)
        if theirs > BLACKJACK or mine > theirs:
            result, reward = "win", 1.0
        elif mine == theirs:
            result, reward = "draw", 0.0
        else:
            result, reward = "loss", -1.0
        info = {
            "result": result,
            "player": show(self.player),
            "player_value": mine,
            "dealer": show(self.dealer),
            "dealer_value": theirs,
        }
        return StepResult(None, reward, True, info)

    def dealt_order(self) -> list[str]:
        """The cards in the order the shoe dealt them: the deal, the player's hits, the dealer's draws."""
        return self.player[:2] + self.dealer[:2] + self.player[2:] + self.dealer[2:]
