"""``blackjack-basic``: basic strategy (hit/stand only) from the latest observation text.

Observations look like ``Your hand: [8, 5] = 13\\nDealer shows: A`` (the shipped rollouts); the policy
reads the most recent one in the conversation and answers ``<action>hit</action>`` or
``<action>stand</action>`` after one short sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gym_services.models.inference_worker.policies.base import Conversation, Policy

_HAND = re.compile(r"Your hand:\s*\[([^\]]*)\]")
_DEALER = re.compile(r"Dealer(?:'s)?\s+(?:shows|up ?card)\s*:?\s*\[?\s*['\"]?(10|[2-9AJQK])", re.IGNORECASE)


def card_value(card: str) -> int:
    card = card.strip().strip("'\"").upper()
    if card == "A":
        return 11
    if card in ("J", "Q", "K"):
        return 10
    return int(card)


@dataclass(frozen=True)
class Hand:
    total: int
    soft: bool


def hand_value(cards: list[str]) -> Hand:
    total = sum(card_value(c) for c in cards)
    aces = sum(1 for c in cards if c.strip().strip("'\"").upper() == "A")
    while total > 21 and aces:
        total -= 10
        aces -= 1
    return Hand(total, aces > 0)


def basic_strategy(hand: Hand, dealer: int) -> str:
    """Hit or stand for a hand against the dealer's up card (2..11, ace = 11)."""
    if hand.soft:
        if hand.total >= 19:
            return "stand"
        if hand.total == 18:
            return "stand" if 2 <= dealer <= 8 else "hit"
        return "hit"
    if hand.total >= 17:
        return "stand"
    if hand.total >= 13:
        return "stand" if 2 <= dealer <= 6 else "hit"
    if hand.total == 12:
        return "stand" if 4 <= dealer <= 6 else "hit"
    return "hit"


def read_observation(text: str) -> tuple[list[str], str] | None:
    hand = _HAND.search(text)
    dealer = _DEALER.search(text)
    if not hand or not dealer:
        return None
    cards = [c.strip().strip("'\"") for c in hand.group(1).split(",") if c.strip()]
    return (cards, dealer.group(1).upper()) if cards else None


class BlackjackBasic(Policy):
    name = "blackjack-basic"
    description = "plays blackjack by basic strategy (hit/stand), answering <action>hit|stand</action>"

    def respond(self, conversation: Conversation) -> str:
        for turn in reversed(conversation.turns):
            if turn.role in ("user", "tool") and (seen := read_observation(turn.text)):
                cards, up = seen
                hand = hand_value(cards)
                action = basic_strategy(hand, card_value(up))
                kind = "soft" if hand.soft else "hard"
                return (
                    f"I hold {', '.join(cards)} for a {kind} {hand.total} against a dealer {up}; "
                    f"basic strategy says {action}.\n<action>{action}</action>"
                )
        return "I cannot see my hand yet, so I stand.\n<action>stand</action>"
