"""blackjack answers like NeMo Gym 0.7.0's: same calls to both, status codes and response bytes compared.

The reference is its own FastAPI app (``oracle/glue_blackjack.py``) with the generators it creates
injected; ours is our app through its Starlette routes, seeded by the body's ``seed``. Every game
in CI: 300 seeded random games (every action text and response shape of ``blackjack_cases``), 160
games covering every outcome of every action, every invalid body, and the deliberate differences.
``benchmarks/conformance_blackjack_lean.py`` runs more.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette

from gym_services.base.config import load_config
from gym_services.resources.blackjack import game
from gym_services.resources.blackjack.app import Config, create_app
from tests.conformance import blackjack_cases as cases
from tests.conformance.http_cases import NESTED_422, Tally, nested_422, run_sequences
from tests.conformance.oracle.client import Oracle
from tests.support.asgi import base_config

#: Deliberate differences: where checkpointing needs another answer. Each is named in the README.
DELIBERATE = {
    "step without a live episode": (
        "a /step whose session has no live episode (never reset, finished, retired, or lost with an "
        "uncheckpointed process) is 404 session_not_found; the reference plays an empty hand against a fresh "
        "dealer (200) or fails (500), which after a restore would score a phantom game"
    ),
    "malformed seed": (
        "seed is ours (a reproducible, checkpointable deal); a malformed one is refused with 400 instead of "
        "ignored like any unknown field"
    ),
}


def blackjack_allowed(call: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """The name of the allowed difference this answer pair is, or None."""
    try:
        error = json.loads(ours.get("body") or "null")
    except ValueError:
        error = None
    code = error.get("error", {}).get("code") if isinstance(error, dict) else None
    if call["path"] == "/step" and ours.get("status") == 404 and code == "session_not_found":
        return "step without a live episode"
    if (
        call["path"] == "/reset"
        and ours.get("status") == 400
        and code == "bad_request"
        and "seed" in str(call.get("json"))
    ):
        return "malformed seed"
    if nested_422(ours, theirs):
        return NESTED_422
    return None


@contextlib.asynccontextmanager
async def our_blackjack(**extra: Any) -> AsyncIterator[Starlette]:
    app = create_app(load_config(Config, overrides=base_config("blackjack", **extra)))
    async with app.router.lifespan_context(app):
        yield app


async def compare(oracle: Oracle, name: str, sequences: list[dict[str, Any]]) -> Tally:
    theirs = oracle.call("blackjack", "run_sequences", sequences)
    for ref in theirs:
        assert ref["overdrawn"] == 0, "the reference created a generator the case did not seed"
    async with our_blackjack() as app:
        ours = await run_sequences(app, sequences)
    tally = Tally()
    tally.compare(name, sequences, ours, theirs, blackjack_allowed)
    return tally


def outcomes(tally_sequences: list[dict[str, Any]], results: list[dict[str, Any]]) -> set[str]:
    seen = set()
    for result in results:
        for answer in result["answers"]:
            body = json.loads(answer["body"]) if answer["status"] == 200 else {}
            if "reward" in body:
                seen.add(body["info"].get("result", "continue"))
    return seen


async def test_random_games_answer_byte_for_byte(oracle: Oracle) -> None:
    games = cases.random_games(300, seed=11)
    tally = await compare(oracle, "random games", games)
    assert not tally.differences, tally.summary()
    assert not tally.allowed and tally.equal_sequences == 300
    assert tally.calls > 600  # the games are not one step long


async def test_every_outcome_of_every_action(oracle: Oracle) -> None:
    games = cases.every_path_games()
    theirs = oracle.call("blackjack", "run_sequences", games)
    assert outcomes(games, theirs) == {"win", "loss", "draw", "bust", "continue"}
    tally = await compare(oracle, "every path", games)
    assert not tally.differences and not tally.allowed, tally.summary()


#: the invalid bodies of NESTED_422
NESTED = {
    f"/step {n}"
    for n in (
        "response function call output in output",
        "response tools entry wrong",
        "response tool_choice wrong",
        "response error wrong",
        "rcp input item content number",
        "rcp input item unknown type",
        "rcp input call without name",
        "rcp tools entry wrong",
    )
}


@pytest.mark.parametrize(("name", "sequence"), cases.invalid_sequences(), ids=[n for n, _ in cases.invalid_sequences()])
async def test_invalid_bodies_are_refused_alike_and_change_nothing(oracle: Oracle, name: str, sequence) -> None:
    tally = await compare(oracle, name, [sequence])
    assert not tally.differences, tally.summary()
    kinds = {a["allowed"] for a in tally.allowed}
    if name in NESTED:
        assert kinds == {NESTED_422}
    elif "seed" in name:
        assert kinds == {"malformed seed"}
    else:
        assert kinds <= {"step without a live episode"}  # an accepted /step body can end the game


async def test_other_routes_and_methods_are_answered_alike(oracle: Oracle) -> None:
    """FastAPI's 404/405 bodies where no route is (the reference's app has no /seed_session, /verify or
    /close), NeMo Gym's liveness routes."""
    calls = cases.route_calls()
    tally = await compare(oracle, "routes", [{"seeds": [], "calls": [call]} for _, call in calls])
    assert not tally.differences and not tally.allowed, tally.summary()
    assert tally.calls == len(calls)


async def test_deliberate_differences_are_the_listed_ones(oracle: Oracle) -> None:
    hit = cases.step_call(cases.response([cases.message(cases.output_text("<action>hit</action>"))]))
    stand = cases.step_call(cases.response([cases.message(cases.output_text("<action>stand</action>"))]))
    sequences = [
        {"seeds": [5], "calls": [stand]},  # no reset: the reference plays an empty hand
        {"seeds": [6], "calls": [hit]},  # no reset: the reference fails (500)
        {"seeds": [7, 8], "calls": [cases.reset_call(7), stand, stand]},  # after the end
        {"seeds": [9], "calls": [{"path": "/reset", "json": {"responses_create_params": cases.RCP, "seed": "x"}}]},
        {"seeds": [9], "calls": [{"path": "/reset", "json": {"responses_create_params": cases.RCP, "seed": -1}}]},
    ]
    tally = await compare(oracle, "deliberate", sequences)
    assert not tally.differences, tally.summary()
    assert [a["allowed"] for a in tally.allowed] == [
        "step without a live episode",
        "step without a live episode",
        "step without a live episode",
        "malformed seed",
        "malformed seed",
    ]
    assert {a["allowed"] for a in tally.allowed} <= set(DELIBERATE)
    statuses = [a["reference"]["status"] for a in tally.allowed]
    assert statuses == [200, 500, 200, 200, 200]  # the stand after the end plays an empty hand too


async def test_the_comparison_catches_a_changed_rule(oracle: Oracle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: with the last action tag taken (our old rule) or the old deal order, games differ."""
    games = cases.random_games(60, seed=3)

    def last_tag(text: str | None) -> str:
        tags = re.findall(r"<action>\s*(hit|stand)\s*</action>", text or "", re.I)
        return "hit" if tags and tags[-1].lower() == "hit" else "stand"

    monkeypatch.setattr("gym_services.resources.blackjack.app.parse_action", last_tag)
    assert (await compare(oracle, "last tag", games)).differences
    monkeypatch.undo()

    def alternating(cls, seed):
        episode = cls(game.Shoe(seed))
        for _ in range(2):
            episode.player.append(episode.shoe.deal())
            episode.dealer.append(episode.shoe.deal())
        return episode

    monkeypatch.setattr(game.Episode, "deal", classmethod(alternating))
    assert len((await compare(oracle, "alternating deal", games)).differences) > 30
