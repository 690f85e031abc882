"""The attempt fence cannot be walked around: a session cookie is signed with the rollout and attempt that made it
(``base/sessions.py``), so a late call of an old attempt is ``409 stale_attempt`` whatever headers it carries, and
changes nothing; the restored attempt, which sends the same cookie with its own headers, goes on, and its answer
signs the cookie again for its attempt (``docs/protocol.md``, "Identity and fencing")."""

from __future__ import annotations

import pytest
from tests.support.asgi import SECRET, Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import SessionCodec
from gym_services.control.admission import call_identity
from gym_services.resources.counter.app import Config, create_app

COOKIE = "gym_session_counter"
OLD = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}
NEW = {"x-ng-rollout-id": "r1", "x-ng-attempt": "1"}


def fresh_app():
    return create_app(load_config(Config, overrides=base_config("counter")))


def ident(rollout_id: str, attempt: int) -> RolloutIdentity:
    return RolloutIdentity(rollout_id=rollout_id, attempt=attempt)


def test_a_call_is_fenced_by_its_headers_else_by_its_sessions_signed_identity() -> None:
    assert call_identity(None, ident("r", 0)) == ident("r", 0)  # no headers: the attempt that made the session
    assert call_identity(ident("r", 2), ident("r", 0)) == ident("r", 2)  # a restored attempt with an older cookie
    assert call_identity(ident("r", 1), None) == ident("r", 1)  # a session made without identity: the headers
    assert call_identity(None, None) is None
    with pytest.raises(ApiError) as other:
        call_identity(ident("r9", 5), ident("r", 0))
    assert other.value.code is ErrorCode.BAD_REQUEST and "rollout 'r'" in other.value.message
    with pytest.raises(ApiError) as older:
        call_identity(ident("r", 0), ident("r", 1))
    assert older.value.code is ErrorCode.STALE_ATTEMPT


def test_the_cookie_carries_the_identity_signed_and_old_cookies_still_read() -> None:
    codec = SessionCodec(SECRET, "counter")
    opened = codec.open(codec.sign("s1", ident("r1", 3)))
    assert opened is not None and opened.session_id == "s1" and opened.identity == ident("r1", 3)
    assert codec.read(codec.sign("s1", ident("r1", 3))) == "s1"
    unsigned = codec.open(codec.sign("s2"))  # a session made without identity headers (or before cookies had one)
    assert unsigned is not None and unsigned.identity is None
    assert SessionCodec(SECRET, "other").open(codec.sign("s1", ident("r1", 3))) is None


async def checkpointed(location: str) -> tuple[dict, dict]:
    """One session of rollout r1 made by attempt 0 (value 1 + 3), checkpointed; its cookie and the persist answer."""
    async with serve(fresh_app()) as client:
        assert (await client.post("/seed_session", json={"start": 1}, headers=OLD)).status_code == 200
        assert (await client.post("/increment", json={"by": 3}, headers=OLD)).json() == {"output": 4}
        cookies = dict(client.cookies)
        return cookies, await Control(client).checkpoint("ck", location, episodes=["r1"])


async def test_a_late_header_less_call_of_the_old_attempt_is_refused_and_changes_nothing(tmp_path) -> None:
    storage_url = f"file://{tmp_path}"
    cookies, persisted = await checkpointed(storage_url)
    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore("ck", storage_url, persisted["manifest_key"], persisted["manifest_sha256"])
        assert restored["episodes"] == {"r1": 1}
        await control.resume("ck")
        client.cookies.update(cookies)
        for headers in ({}, OLD, {"x-ng-rollout-id": "r9", "x-ng-attempt": "0"}):
            late = await client.post("/increment", json={"by": 100}, headers=headers)
            code = "bad_request" if "r9" in headers.values() else "stale_attempt"
            assert late.json()["error"]["code"] == code, (headers, late.text)
            assert "set-cookie" not in late.headers  # the session stays the restored one's
        # the restored attempt sends the same cookie (its boundary kept it) with its own headers: it goes on, and its
        # answer signs the cookie again for attempt 1
        went_on = await client.post("/increment", json={"by": 6}, headers=NEW)
        assert went_on.json() == {"output": 10}
        renewed = SessionCodec(SECRET, "counter").open(went_on.cookies[COOKIE])
        assert renewed is not None and renewed.identity == ident("r1", 1)
        assert renewed.session_id == SessionCodec(SECRET, "counter").read(cookies[COOKIE])
        # with the renewed cookie a call without headers is attempt 1's; a copy of the old cookie is still stale
        assert (await client.post("/verify", json={"target": 10})).json() == {"reward": 1.0, "value": 10}
        client.cookies.clear()
        client.cookies.update(cookies)
        assert (await client.post("/increment", json={"by": 1})).json()["error"]["code"] == "stale_attempt"


async def test_a_session_made_without_identity_is_fenced_by_the_headers_of_each_call(tmp_path) -> None:
    """Nothing names its rollout: it belongs to no attempt, so no attempt of it is stale (``Scope`` keeps it)."""
    storage_url = f"file://{tmp_path}"
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"start": 1})
        cookies = dict(client.cookies)
        persisted = await Control(client).checkpoint("ck", storage_url)
        assert persisted["scope"]["unowned_total"] == 1
    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        assert (await control.restore("ck", storage_url, persisted["manifest_key"]))["episodes"] == {}
        await control.resume("ck")
        client.cookies.update(cookies)
        assert (await client.post("/increment", json={"by": 2})).json() == {"output": 3}
        await control.retire("r1", 0)  # a rollout the headers name is fenced as always
        refused = await client.post("/increment", json={"by": 2}, headers=OLD)
        assert refused.json()["error"]["code"] == "stale_attempt"
