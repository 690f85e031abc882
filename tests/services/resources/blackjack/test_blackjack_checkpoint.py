"""Blackjack episodes checkpointed mid-game, restored into a fresh app, continued exactly."""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.support.asgi import Control, base_config, serve
from tests.support.records import records, rewrite_record

from gym_services.base.config import load_config
from gym_services.resources.blackjack import state as state_module
from gym_services.resources.blackjack.app import SEED_HEADER, Config, create_app, derive_seed
from gym_services.resources.blackjack.game import Episode, Shoe
from gym_services.resources.blackjack.state import EpisodeStore

#: seed 36 lets the player hit three times and stand, then the dealer draws three cards
LONG = (36, ["hit", "hit", "hit", "stand"])
#: seed 4 busts on the second hit
BUST = (4, ["hit", "hit"])
COOKIE = "gym_session_blackjack"


def fresh_app(**extra):
    return create_app(load_config(Config, overrides=base_config("blackjack", **extra)))


def ident(rollout_id: str, attempt: int = 0) -> dict[str, str]:
    return {"x-ng-rollout-id": rollout_id, "x-ng-attempt": str(attempt)}


RCP = {"input": [{"role": "user", "content": "Deal me in."}]}


def model_response(text: str) -> dict:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_1",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def act(action: str) -> dict:
    return {
        "responses_create_params": RCP,
        "response": model_response(f"My total decides it. <action>{action}</action>"),
    }


def reset_body(seed: int | None = None, **extra) -> dict:
    return {"responses_create_params": RCP} | ({} if seed is None else {"seed": seed}) | extra


async def uninterrupted(seed: int | None, actions: list[str], rollout_id: str) -> list[dict]:
    async with serve(fresh_app()) as client:
        outputs = [(await client.post("/reset", json=reset_body(seed), headers=ident(rollout_id))).json()]
        for action in actions:
            outputs.append((await client.post("/step", json=act(action), headers=ident(rollout_id))).json())
    return outputs


async def checkpointed(storage_url: str, seed: int | None, actions: list[str], cut: int, rollout_id: str) -> list[dict]:
    """Reset, ``cut`` steps, checkpoint, then a fresh app restores and plays the rest as attempt 1."""
    async with serve(fresh_app()) as client:
        outputs = [(await client.post("/reset", json=reset_body(seed), headers=ident(rollout_id))).json()]
        cookies = dict(client.cookies)
        for action in actions[:cut]:
            outputs.append((await client.post("/step", json=act(action), headers=ident(rollout_id))).json())
        committed = await Control(client).checkpoint("ck1", storage_url, episodes=[rollout_id])
        assert committed["records"] == 1 and committed["episodes"] == [rollout_id]

    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore("ck1", storage_url, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["episodes"] == {rollout_id: 1}
        assert (await control.status())["live"] == {"episodes": 1}
        await control.resume("ck1")
        client.cookies.update(cookies)
        stale = await client.post("/step", json=act("hit"), headers=ident(rollout_id, 0))
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
        for action in actions[cut:]:
            outputs.append((await client.post("/step", json=act(action), headers=ident(rollout_id, 1))).json())
        assert (await control.status())["live"] == {"episodes": 0}
        after = await client.post("/step", json=act("hit"), headers=ident(rollout_id, 1))
        assert after.status_code == 404 and after.json()["error"]["code"] == "session_not_found"
    return outputs


SCENARIOS = [
    pytest.param(*LONG, 0, id="long-cut0"),
    pytest.param(*LONG, 1, id="long-cut1"),
    pytest.param(*LONG, 2, id="long-cut2"),
    pytest.param(*LONG, 3, id="long-cut3"),
    pytest.param(*BUST, 1, id="bust-cut1"),
    pytest.param(None, ["stand"], 0, id="rollout-seed-cut0"),
]


@pytest.mark.parametrize(("seed", "actions", "cut"), SCENARIOS)
async def test_restored_episode_continues_like_uninterrupted(storage_url: str, seed, actions, cut) -> None:
    expected = await uninterrupted(seed, actions, "task0-0")
    assert expected[-1]["terminated"] is True and all(not o.get("terminated") for o in expected[:-1])
    assert await checkpointed(storage_url, seed, actions, cut, "task0-0") == expected


async def test_long_game_draws_dealer_cards_after_restore(tmp_path) -> None:
    """The scenario is not trivial: after a cut at 3 steps, the restored shoe deals the dealer three cards."""
    expected = await uninterrupted(*LONG, "task0-0")
    final = expected[-1]
    assert final["info"] == {
        "result": "win",
        "player": "[7, 2, A, 6, 3]",
        "player_value": 19,
        "dealer": "[2, A, 2, 10, Q]",
        "dealer_value": 25,
    }
    assert expected[0]["info"] == {}
    assert await checkpointed(f"file://{tmp_path}", *LONG, 3, "task0-0") == expected


async def test_mutation_reseeding_on_restore_breaks_equivalence(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The equivalence test is not vacuous: a restore that reseeds instead of restoring the position fails it."""
    expected = await uninterrupted(*LONG, "task0-0")
    monkeypatch.setattr(state_module.Shoe, "at", classmethod(lambda cls, seed, draws: cls(seed)))
    assert await checkpointed(f"file://{tmp_path}", *LONG, 1, "task0-0") != expected


# --- seeds ----------------------------------------------------------------------------


async def test_seed_sources() -> None:
    async with serve(fresh_app()) as client:

        async def seed_of(body: dict, headers: dict | None = None) -> int:
            reply = await client.post("/reset", json=body, headers=headers)
            assert reply.status_code == 200 and reply.json()["info"] == {}, reply.text
            return int(reply.headers[SEED_HEADER])

        body_seed = await seed_of(reset_body(36))
        extra_seed = await seed_of(reset_body(extra={"seed": 36}))
        derived = await seed_of(reset_body(), ident("task7-0"))
        other = await seed_of(reset_body(), ident("task7-1"))
        random_a, random_b = await seed_of(reset_body()), await seed_of(reset_body())
        observation = (await client.post("/reset", json=reset_body(36))).json()["observation"]
        bad_seeds = (
            {"seed": -1},
            {"seed": 2**64},
            {"seed": True},
            {"seed": "36"},
            {"extra": {"seed": "36"}},
            {"extra": {"seed": True}},
        )
        for bad in bad_seeds:
            refused = await client.post("/reset", json=reset_body(**bad))
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_request", bad
    assert body_seed == extra_seed == 36
    assert observation == Episode.deal(36).observation()
    assert derived == derive_seed("blackjack", "task7-0") != other
    assert random_a != random_b
    async with serve(fresh_app(seed_from_rollout_id=False)) as client:
        unseeded = await client.post("/reset", json=reset_body(), headers=ident("task7-0"))
    assert int(unseeded.headers[SEED_HEADER]) != derived


# --- routes ---------------------------------------------------------------------------


async def test_routes_and_invalid_actions() -> None:
    async with serve(fresh_app()) as client:
        control = Control(client)
        missing = await client.post("/step", json=act("hit"))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
        reset = await client.post("/reset", json=reset_body(36))
        assert reset.headers["x-ng-checkpoint-verify"] == "wait"
        assert reset.content == (
            b'{"observation":"Your hand: [7, 2] = 9\\nDealer shows: 2\\nRespond with <action>hit</action> or '
            b'<action>stand</action>.","info":{}}'
        )
        status = await control.status()
        assert (status["role"], status["checkpoint_mode"], status["live"]) == (
            "environment",
            "exported",
            {"episodes": 1},
        )
        invalid = await client.post(
            "/step", json={"responses_create_params": RCP, "response": model_response("<action>double down</action>")}
        )
        result = invalid.json()
        assert result["terminated"] is True and result["observation"] is None
        assert result["info"]["player"] == "[7, 2]"  # an invalid action stands
        assert (await control.status())["live"] == {"episodes": 0}
        await client.post("/reset", json=reset_body(36))
        first = (
            await client.post(
                "/step",
                json={
                    "responses_create_params": RCP,
                    "response": model_response("<action>hit</action> or rather <action>stand</action>"),
                },
            )
        ).json()
        assert first["observation"].startswith("Your hand: [7, 2, A] = 20")  # the first tag counts
        no_response = await client.post(
            "/step", json={"responses_create_params": RCP, "action": "<action>hit</action>"}
        )
        assert no_response.status_code == 422 and no_response.json()["detail"][0]["loc"] == ["body", "response"]
        malformed = await client.post("/step", content=b"[1, 2", headers={"content-type": "application/json"})
        assert malformed.status_code == 422 and malformed.json()["detail"][0]["type"] == "json_invalid"
        assert (await control.status())["live"] == {"episodes": 1}  # refused bodies change nothing
        assert (await client.post("/close", json={})).status_code == 404  # NeMo Gym's blackjack has no /close


async def test_steps_are_gated_and_inflight_step_finishes_before_prepare(tmp_path) -> None:
    loc = f"file://{tmp_path}"
    async with serve(fresh_app(step_latency_s=0.4)) as client:
        control = Control(client)
        await client.post("/reset", json=reset_body(36), headers=ident("r1"))
        stepping = asyncio.create_task(client.post("/step", json=act("hit"), headers=ident("r1")))
        await asyncio.sleep(0.1)
        assert (await control.status())["inflight"] == 1  # the step is running when prepare arrives
        prepared = await control.prepare("ck1")
        assert prepared["status"] == "prepared" and prepared["waited_s"] > 0
        assert stepping.done() and (await stepping).json()["observation"].startswith("Your hand: [7, 2, A] = 20")
        for path, body in (("/step", act("hit")), ("/reset", reset_body(1))):
            parked = await client.post(path, json=body, headers=ident("r1"))
            assert parked.status_code == 409 and parked.json()["error"]["code"] == "checkpoint_parked"
            assert 0.02 <= float(parked.headers["retry-after"]) <= 0.1  # the first pause: a 0.1 s guess, less its age
        committed = await control.capture_persist("ck1", loc)
        await control.resume("ck1")
        assert (await client.post("/step", json=act("stand"), headers=ident("r1"))).status_code == 200
    state = json.loads(next(iter(records(loc, committed["manifest_key"]).values())))["state"]
    assert state == {"version": 2, "seed": 36, "draws": 5, "player": ["7", "2", "A"], "dealer": ["2", "A"], "steps": 1}
    assert committed["records"] == 1


# --- retire, invalid state, aliasing ----------------------------------------------------


async def test_retired_episode_is_gone_and_its_cookie_refused(tmp_path) -> None:
    async with serve(fresh_app()) as client:
        control = Control(client)
        a = await client.post("/reset", json=reset_body(36), headers=ident("a"))
        cookie_a = {COOKIE: a.cookies[COOKIE]}
        client.cookies.clear()
        b = await client.post("/reset", json=reset_body(4), headers=ident("b"))
        cookie_b = {COOKIE: b.cookies[COOKIE]}
        client.cookies.clear()
        assert (await control.retire("a", 0))["retired"] is True
        assert (await control.status())["live"] == {"episodes": 1}
        client.cookies.update(cookie_a)
        gone = await client.post("/step", json=act("hit"))
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "stale_attempt"
        client.cookies.clear()
        client.cookies.update(cookie_b)
        ok = await client.post("/step", json=act("hit"), headers=ident("b"))
        assert ok.status_code == 200 and ok.json()["observation"].startswith("Your hand: [5, 6, 8] = 19")
        app = client._transport.app
        assert list(app.state.episodes.episodes) == [app.state.session_codec.read(cookie_b[COOKIE])]
        committed = await control.checkpoint("ck1", f"file://{tmp_path}")
        assert committed["episodes"] == ["b"] and committed["records"] == 1


def _rewrite_record(location: str, manifest_key: str, record_key: str, mutate) -> None:
    """Change one record's state and keep the manifest's digests consistent, so only validation can refuse it."""

    def change(blob: bytes) -> bytes:
        payload = json.loads(blob)
        mutate(payload["state"])
        return json.dumps(payload).encode()

    rewrite_record(location, manifest_key, record_key, change)


async def test_invalid_state_in_batch_installs_nothing(storage_url: str) -> None:
    async with serve(fresh_app()) as client:
        good = await client.post("/reset", json=reset_body(36), headers=ident("good"))
        good_cookie = {COOKIE: good.cookies[COOKIE]}
        client.cookies.clear()
        await client.post("/reset", json=reset_body(4), headers=ident("bad"))
        committed = await Control(client).checkpoint("ck1", storage_url)
        assert committed["records"] == 2

    stored = records(storage_url, committed["manifest_key"])
    bad_key = next(k for k, blob in stored.items() if json.loads(blob)["state"]["seed"] == 4)
    _rewrite_record(storage_url, committed["manifest_key"], bad_key, lambda s: s.update(seed=5))

    async with serve(fresh_app()) as client:
        control = Control(client)
        refused = await control.restore("ck1", storage_url, committed["manifest_key"], expect=422)
        assert (
            refused["error"]["code"] == "invalid_state" and "does not deal these hands" in refused["error"]["message"]
        )
        status = await control.status()
        assert status["phase"] == "fresh" and status["live"] == {"episodes": 0}
        assert client._transport.app.state.episodes.episodes == {}
        client.cookies.update(good_cookie)
        assert (await client.post("/step", json=act("hit"))).status_code == 404
        assert (await client.post("/reset", json=reset_body(1))).status_code == 200


VALID = {"version": 2, "seed": 36, "draws": 4, "player": ["7", "2"], "dealer": ["2", "A"], "steps": 0}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 1}, "version"),
        ({"seed": 37}, "does not deal these hands"),
        ({"draws": 5}, "draws 5 != 4"),
        ({"player": ["7", "1"]}, "player.1"),
        ({"dealer": ["2", "A", "5"]}, "dealer"),
        ({"seed": "36"}, "seed"),
        ({"seed": -1}, "seed"),
        ({"steps": 1.5}, "steps"),
        ({"extra": 1}, "extra"),
        ({"player": ["K", "Q", "5"], "draws": 5, "steps": 1}, "busted"),
    ],
)
def test_restore_validates_every_state_before_installing(change: dict, message: str) -> None:
    store = EpisodeStore()
    with pytest.raises(state_module.InvalidState, match=message):
        store.restore_session_states({"ok": dict(VALID), "broken": {**VALID, **change}})
    assert store.episodes == {}
    with pytest.raises(state_module.InvalidState, match="version"):
        store.restore_session_states({"missing": {k: v for k, v in VALID.items() if k != "version"}})
    store.restore_session_states({"ok": dict(VALID)})
    assert store.episodes["ok"].shoe.draws == 4


def test_export_and_restore_do_not_alias_live_state() -> None:
    store = EpisodeStore()
    store.episodes["s"] = Episode.deal(36)
    exported = store.export_session_states()
    frozen = json.loads(json.dumps(exported))
    store.episodes["s"].step("hit")  # the live episode moves on
    assert exported == frozen
    exported["s"]["player"].append("K")  # and the export can be changed without touching it
    assert store.episodes["s"].player == ["7", "2", "A"]

    states = {"t": dict(VALID, player=list(VALID["player"]), dealer=list(VALID["dealer"]))}
    other = EpisodeStore()
    other.restore_session_states(states)
    states["t"]["player"].append("K")
    states["t"]["dealer"].clear()
    restored = other.episodes["t"]
    assert (restored.player, restored.dealer) == (["7", "2"], ["2", "A"])
    assert restored.step("hit").observation == Episode.deal(36).step("hit").observation
    assert isinstance(restored.shoe, Shoe)
