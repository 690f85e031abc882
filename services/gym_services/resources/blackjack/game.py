"""Blackjack rules, cards and text, with no HTTP in sight (REFERENCE B.4).

An infinite shoe: every card is drawn uniformly from the 13 ranks. The shoe is a seeded
``random.Random`` plus the number of cards drawn so far, so its position is two integers:
a shoe rebuilt from ``(seed, draws)`` deals exactly the cards an uninterrupted one would.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

RANKS: tuple[str, ...] = ("2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A")
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
    """The last ``<action>hit|stand</action>`` in ``text``; anything else means ``stand``."""
    found = _ACTION.findall(text or "")
    return "hit" if found and found[-1].lower() == "hit" else "stand"


def response_text(response: Any) -> str:
    """The assistant text of a Responses API object (or a plain string)."""
    if isinstance(response, str):
        return response
    if not isinstance(response, dict):
        return ""
    if isinstance(response.get("output_text"), str):
        return response["output_text"]
    parts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str) and item.get("role", "assistant") == "assistant":
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p["text"]
                for p in content
                if isinstance(p, dict) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
            )
    return "".join(parts)


@dataclass
class StepResult:
    observation: str
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
        """Player, dealer, player, dealer, as at a table."""
        episode = cls(Shoe(seed))
        for _ in range(2):
            episode.player.append(episode.shoe.deal())
            episode.dealer.append(episode.shoe.deal())
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
                text = f"Your hand: {show(self.player)} = {value}\nBust! You lose."
                return StepResult(text, -1.0, True, info)
            return StepResult(self.observation(), 0.0, False, {})
        while hand_value(self.dealer) < DEALER_STANDS_AT:
            self.dealer.append(self.shoe.deal())
        mine, theirs = hand_value(self.player), hand_value(self.dealer)
        if theirs > BLACKJACK or mine > theirs:
            result, reward, verdict = "win", 1.0, "You win!"
        elif mine == theirs:
            result, reward, verdict = "draw", 0.0, "It's a draw."
        else:
            result, reward, verdict = "loss", -1.0, "You lose."
        info = {
            "result": result,
            "player": show(self.player),
            "player_value": mine,
            "dealer": show(self.dealer),
            "dealer_value": theirs,
        }
        text = f"Your hand: {show(self.player)} = {mine}\nDealer's hand: {show(self.dealer)} = {theirs}\n{verdict}"
        return StepResult(text, reward, True, info)

    def dealt_order(self) -> list[str]:
        """The cards in the order the shoe dealt them (deal order, then the player's hits)."""
        order = [self.player[0], self.dealer[0], self.player[1], self.dealer[1]]
        return order + self.player[2:] + self.dealer[2:]
