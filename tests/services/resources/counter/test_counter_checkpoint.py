"""The example participant: seed, mutate, checkpoint, restore into a fresh app, continue."""

from __future__ import annotations

import json

import pytest
from tests.support.asgi import Control, base_config, serve
from tests.support.records import corrupt_record, records, rewrite_record

from gym_services.base.config import load_config
from gym_services.resources.counter.app import Config, create_app


def fresh_app(**extra):
    return create_app(load_config(Config, overrides=base_config("counter", **extra)))


STEPS = [3, -1, 10, 5]


async def run_uninterrupted() -> list:
    async with serve(fresh_app()) as client:
        outputs = [(await client.post("/seed_session", json={"start": 1})).json()["value"]]
        for by in STEPS:
            outputs.append((await client.post("/increment", json={"by": by})).json()["output"])
        outputs.append((await client.post("/verify", json={"target": 18})).json())
        return outputs


@pytest.mark.parametrize("cut", [0, 1, 2, 4])
async def test_restored_session_continues_like_uninterrupted(storage_url: str, cut: int) -> None:
    expected = await run_uninterrupted()
    ident = {"x-ng-rollout-id": "task0-0", "x-ng-attempt": "0"}
    async with serve(fresh_app()) as client:
        outputs = [(await client.post("/seed_session", json={"start": 1}, headers=ident)).json()["value"]]
        cookies = dict(client.cookies)
        for by in STEPS[:cut]:
            outputs.append((await client.post("/increment", json={"by": by}, headers=ident)).json()["output"])
        committed = await Control(client).checkpoint("ck1", storage_url, episodes=["task0-0"])
        assert committed["records"] == 1 and committed["episodes"] == ["task0-0"]

    next_ident = {"x-ng-rollout-id": "task0-0", "x-ng-attempt": "1"}
    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore("ck1", storage_url, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["episodes"] == {"task0-0": 1}
        await control.resume("ck1")
        client.cookies.update(cookies)
        stale = await client.post("/increment", json={"by": 1}, headers=ident)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
        for by in STEPS[cut:]:
            outputs.append((await client.post("/increment", json={"by": by}, headers=next_ident)).json()["output"])
        outputs.append((await client.post("/verify", json={"target": 18}, headers=next_ident)).json())
        assert (await control.status())["live"] == {"sessions": 0}
    assert outputs == expected


async def test_invalid_state_in_batch_installs_nothing(tmp_path) -> None:
    loc = f"file://{tmp_path}"
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"start": 1})
        client.cookies.clear()  # a second session
        other = await client.post("/seed_session", json={"start": 2})
        assert other.status_code == 200
        committed = await Control(client).checkpoint("ck1", loc)
        assert committed["records"] == 2

    # corrupt one state but keep digests consistent: only validation can refuse it
    bad_key = list(records(loc, committed["manifest_key"]))[1]

    def not_an_int(blob: bytes) -> bytes:
        payload = json.loads(blob)
        payload["state"]["value"] = "not an int"
        return json.dumps(payload).encode()

    rewrite_record(loc, committed["manifest_key"], bad_key, not_an_int)

    async with serve(fresh_app()) as client:
        control = Control(client)
        refused = await control.restore("ck1", loc, committed["manifest_key"], expect=422)
        assert refused["error"]["code"] == "invalid_state" and "must be an integer" in refused["error"]["message"]
        status = await control.status()
        assert status["phase"] == "fresh" and status["live"] == {"sessions": 0}
        assert app_values(client) == {}
        # and the server still works
        assert (await client.post("/seed_session", json={"start": 5})).status_code == 200


def app_values(client) -> dict:
    app = client._transport.app  # the in-process app
    return app.state.participant.hooks.values


async def test_corrupt_record_restore_refused(tmp_path) -> None:
    loc = f"file://{tmp_path}"
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"start": 1})
        committed = await Control(client).checkpoint("ck1", loc)
    key = next(iter(records(loc, committed["manifest_key"])))
    corrupt_record(loc, committed["manifest_key"], key, lambda blob: blob.replace(b"1", b"2"))
    async with serve(fresh_app()) as client:
        refused = await Control(client).restore("ck1", loc, committed["manifest_key"], expect=422)
        assert "corrupt" in refused["error"]["message"]
        missing = await Control(client).restore(
            "ck2", loc, "checkpoints/ck2/participants/counter/manifest.json", expect=404
        )
        assert missing["error"]["code"] == "unknown_checkpoint"


async def test_abort_after_restore_uninstalls(tmp_path) -> None:
    loc = f"file://{tmp_path}"
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"start": 1})
        committed = await Control(client).checkpoint("ck1", loc)
    async with serve(fresh_app()) as client:
        control = Control(client)
        await control.restore("ck1", loc, committed["manifest_key"])
        assert (await control.status())["live"] == {"sessions": 1}
        await control.abort("ck1")
        status = await control.status()
        assert status["live"] == {"sessions": 0} and status["phase"] == "fresh"


async def test_retired_session_refused_while_other_keeps_working(tmp_path) -> None:
    async with serve(fresh_app()) as client:
        a = {"x-ng-rollout-id": "a", "x-ng-attempt": "0"}
        b = {"x-ng-rollout-id": "b", "x-ng-attempt": "0"}
        r = await client.post("/seed_session", json={"start": 1}, headers=a)
        cookie_a = r.cookies
        client.cookies.clear()
        r = await client.post("/seed_session", json={"start": 100}, headers=b)
        cookie_b = r.cookies
        client.cookies.clear()
        await Control(client).retire("a", 0)
        client.cookies.clear()
        client.cookies.update(cookie_a)
        gone = await client.post("/increment", json={"by": 1})
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "stale_attempt"
        client.cookies.clear()
        client.cookies.update(cookie_b)
        ok = await client.post("/increment", json={"by": 1}, headers=b)
        assert ok.json() == {"output": 101}
        committed = await Control(client).checkpoint("ck1", f"file://{tmp_path}")
        assert committed["episodes"] == ["b"]


async def test_session_dropped_by_failed_verify_is_left_out(tmp_path) -> None:
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "a"})
        app = client._transport.app
        participant = app.state.participant
        # verify raised after dropping the session: the participant still tracks it
        participant.hooks.values.clear()
        assert participant.live() == {"sessions": 1}
        committed = await Control(client).checkpoint("ck1", f"file://{tmp_path}")
        assert committed["records"] == 0


async def test_first_session_seed_drops_only_unreachable_sessions_of_its_rollout(tmp_path) -> None:
    """``x-ng-first-session: 1`` on a seed drops the rollout's other sessions up to that attempt (their
    cookies are refused after); other rollouts, and seeds without the header, keep theirs."""
    async with serve(fresh_app()) as client:

        async def seed(rollout: str, attempt: int, first: bool) -> dict[str, str]:
            client.cookies.clear()
            headers = {"x-ng-rollout-id": rollout, "x-ng-attempt": str(attempt)}
            if first:
                headers["x-ng-first-session"] = "1"
            assert (await client.post("/seed_session", json={"start": 0}, headers=headers)).status_code == 200
            return dict(client.cookies)

        participant = client._transport.app.state.participant  # type: ignore[attr-defined]
        old = await seed("r1", 1, first=True)
        second = await seed("r1", 1, first=False)  # no header: the agent holds a session here already
        other = await seed("r2", 1, first=True)
        assert len(participant.sessions) == 3
        fresh = await seed("r1", 2, first=True)  # attempt 2 holds nothing here: attempt 1's sessions are unreachable
        also = await seed("r1", 2, first=False)
        kept = sorted(f"{ident.rollout_id}:{ident.attempt}" for ident in participant.sessions.values())
        assert kept == ["r1:2", "r1:2", "r2:1"]
        for cookies, rollout, status in (
            (old, "r1", 409),
            (second, "r1", 409),
            (other, "r2", 200),
            (fresh, "r1", 200),
            (also, "r1", 200),
        ):
            client.cookies.clear()
            client.cookies.update(cookies)
            reply = await client.post(
                "/increment", json={"by": 1}, headers={"x-ng-rollout-id": rollout, "x-ng-attempt": "2"}
            )
            assert reply.status_code == status, reply.text
