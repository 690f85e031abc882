"""Runs INSIDE the oracle environment: NeMo Gym's blackjack server, its own app, driven over HTTP.

The reference deals from ``random.Random()`` created per episode (and per step of an unknown
session); nothing seeds it. To compare games, the glue injects the generators: the app module's
``random`` is replaced by a namespace whose ``Random()`` returns ``random.Random(seed)`` for the
next seed the caller listed, so the reference deals exactly the cards a seeded generator deals.
Everything else (routes, validation, the game, the reward) is the reference's own code.
"""

from __future__ import annotations

import json
import random
import types
from typing import Any

from framework import Session, build_app, install_import_shims, server_config

_app: Any = None
_seeds: list[int] = []
_overdrawn = 0


def _next_generator() -> random.Random:
    global _overdrawn
    if not _seeds:
        _overdrawn += 1
        return random.Random(0)  # reported: the caller did not expect this generator
    return random.Random(_seeds.pop(0))


def _app_instance() -> Any:
    global _app
    if _app is None:
        install_import_shims()
        import resources_servers.blackjack.app as blackjack
        from nemo_gym.base_resources_server import BaseResourcesServerConfig

        blackjack.random = types.SimpleNamespace(Random=_next_generator)
        config = BaseResourcesServerConfig(**server_config("blackjack"))
        _server, _app = build_app(blackjack.BlackjackEnv, config)
    return _app


def game_over(call: dict[str, Any], answer: dict[str, Any]) -> bool:
    """A ``/step`` answered 200 with ``terminated`` or ``truncated``: an ``until_over`` sequence stops there."""
    if call.get("path") != "/step" or answer["status"] != 200:
        return False
    body = json.loads(answer["body"])
    return bool(body.get("terminated") or body.get("truncated"))


def run_sequences(sequences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sequence ``{seeds, calls, until_over?}`` runs in a fresh client session (its own cookie jar).

    ``seeds`` feed the generators the reference creates, in order. With ``until_over`` the
    sequence ends after the step that ends the game. Returns per sequence
    ``{answers: [{status, body}], unused_seeds, overdrawn}``.
    """
    global _overdrawn
    app = _app_instance()
    results = []
    for sequence in sequences:
        _seeds[:] = list(sequence.get("seeds", []))
        _overdrawn = 0
        session = Session(app)
        try:
            answers = []
            for call in sequence["calls"]:
                answers.append(session.request(call))
                if sequence.get("until_over") and game_over(call, answers[-1]):
                    break
        finally:
            session.close()
        results.append({"answers": answers, "unused_seeds": len(_seeds), "overdrawn": _overdrawn})
    return results
