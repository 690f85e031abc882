"""Blackjack rules and text, checked against the recorded NeMo Gym rollouts where they show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_services.base.nemo_responses import ResponseObject, UnreadableOutput
from gym_services.resources.blackjack.game import Episode, Shoe, hand_value, parse_action

DATA = Path(__file__).resolve().parents[4] / "services/gym_services/resources/blackjack/data"
ROLLOUTS = [json.loads(line) for line in (DATA / "example_rollouts.jsonl").read_text().splitlines()]


class ScriptedShoe(Shoe):
    """Deals given cards, to rebuild the recorded games."""

    def __init__(self, cards: list[str]) -> None:
        super().__init__(0)
        self.cards = list(cards)

    def deal(self) -> str:
        self.draws += 1
        return self.cards.pop(0)


def scripted(player: list[str], dealer: list[str], then: list[str]) -> Episode:
    return Episode(ScriptedShoe(then), list(player), list(dealer))


@pytest.mark.parametrize(
    ("cards", "value"),
    [
        (["8", "5", "3", "Q"], 26),
        (["A", "5", "9", "10"], 25),
        (["8", "A"], 19),
        (["A", "2", "2", "3"], 18),
        (["A", "A"], 12),
        (["A", "A", "9"], 21),
        (["K", "Q", "A"], 21),
        (["10", "J"], 20),
    ],
)
def test_hand_values(cards: list[str], value: int) -> None:
    assert hand_value(cards) == value


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("<action>hit</action>", "hit"),
        ("<action>stand</action>", "stand"),
        ("I think <action> HIT </action>", "hit"),
        ("first <action>stand</action>, no wait: <action>hit</action>", "stand"),  # the first tag counts
        ("<action>hit</action> hmm, <action>stand</action>", "hit"),
        ("<action>double</action>", "stand"),
        ("<action>double</action> then <action>hit</action>", "hit"),  # the first tag that is an action
        ("<ACTION>\nStand\n</ACTION>", "stand"),
        ("hit me", "stand"),
        ("", "stand"),
    ],
)
def test_parse_action_defaults_to_stand(text: str, action: str) -> None:
    assert parse_action(text) == action


def response(*items: dict) -> ResponseObject:
    return ResponseObject.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": list(items),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def test_message_text_reads_what_nemo_gym_reads() -> None:
    reasoning = {"id": "rs", "type": "reasoning", "summary": [{"type": "summary_text", "text": "<action>hit</action>"}]}
    parts = [
        {"type": "output_text", "text": "<action>st", "annotations": []},
        {"type": "refusal", "refusal": "x"},
        {"type": "output_text", "text": "and</action>", "annotations": []},
    ]
    message = {"id": "m", "type": "message", "role": "assistant", "content": parts}
    assert response(reasoning, message).message_text() == "<action>stand</action>"
    easy = {"type": "message", "role": "user", "content": "<action>hit</action>"}  # a string content counts, any role
    assert parse_action(response(easy, message).message_text()) == "hit"
    listed = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    with pytest.raises(UnreadableOutput):  # the reference fails on it (500)
        response(listed).message_text()


def test_observations_and_infos_match_the_recorded_rollouts() -> None:
    bust, win = ROLLOUTS[0], ROLLOUTS[1]
    # rollout 0: [8, 5] vs A, hit -> 3, hit -> Q: bust at 26
    game = scripted(["8", "5"], ["A", "9"], ["3", "Q"])
    assert game.observation() == bust["responses_create_params"]["input"][-1]["content"]
    first = game.step("hit")
    assert first.observation == bust["response"]["output"][1]["content"] and not first.terminated
    final = game.step("hit")
    assert (final.observation, final.reward, final.terminated, final.info) == (None, bust["reward"], True, bust["info"])
    # rollout 1: [10, 3] vs A, stand; dealer draws 9 and 10 from A, 5
    game = scripted(["10", "3"], ["A", "5"], ["9", "10"])
    assert game.observation() == win["responses_create_params"]["input"][-1]["content"]
    final = game.step("stand")
    assert (final.observation, final.reward, final.terminated, final.info) == (None, win["reward"], True, win["info"])


def test_the_deal_is_player_player_dealer_dealer() -> None:
    shoe = Shoe(7)
    cards = [shoe.deal() for _ in range(4)]
    game = Episode.deal(7)
    assert (game.player, game.dealer) == (cards[:2], cards[2:]) and game.shoe.draws == 4


@pytest.mark.parametrize(
    ("player", "dealer", "then", "result", "reward", "dealer_after"),
    [
        (["10", "8"], ["10", "7"], [], "win", 1.0, ["10", "7"]),  # dealer stands on 17
        (["10", "7"], ["A", "6"], [], "draw", 0.0, ["A", "6"]),  # and on a soft 17
        (["10", "6"], ["10", "2"], ["5"], "loss", -1.0, ["10", "2", "5"]),
        (["10", "6"], ["10", "2"], ["4", "K"], "win", 1.0, ["10", "2", "4", "K"]),  # dealer busts
    ],
)
def test_dealer_draws_to_17(player, dealer, then, result, reward, dealer_after) -> None:
    outcome = scripted(player, dealer, then).step("stand")
    assert (outcome.info["result"], outcome.reward, outcome.terminated) == (result, reward, True)
    assert outcome.info["dealer"] == "[" + ", ".join(dealer_after) + "]"


def test_shoe_position_is_seed_and_draws() -> None:
    uninterrupted = Shoe(36)
    cards = [uninterrupted.deal() for _ in range(10)]
    for draws in range(10):
        resumed = Shoe.at(36, draws)
        assert resumed.draws == draws
        assert [resumed.deal() for _ in range(10 - draws)] == cards[draws:]
