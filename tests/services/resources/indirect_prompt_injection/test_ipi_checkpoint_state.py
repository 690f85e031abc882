"""The session hooks through the real control routes: invalid restores, retire, failed verify,
aliasing, non-JSON values, non-finite numbers, key order, records of the previous schema."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import httpx
import pytest
from tests.services.resources.indirect_prompt_injection.scenarios import (
    COOKIE,
    TASKS,
    fresh_app,
    ident,
    verify_body,
)
from tests.support import records as stored
from tests.support.asgi import Control, serve

from gym_services.control.participant import InvalidState
from gym_services.resources.indirect_prompt_injection import verifier
from gym_services.resources.indirect_prompt_injection.app import NOT_SEEDED
from gym_services.resources.indirect_prompt_injection.state import NonJsonValue, Session, SessionStore


def sessions_of(client: httpx.AsyncClient) -> SessionStore:
    return client._transport.app.state.sessions


async def seed(client: httpx.AsyncClient, task_index: int, attempt: int = 0) -> dict[str, str]:
    """Seed a new session (fresh cookie) and return its cookie."""
    client.cookies.clear()
    resp = await client.post("/seed_session", json=TASKS[task_index], headers=ident(task_index, attempt))
    assert resp.status_code == 200 and resp.headers["x-ng-checkpoint-verify"] == "wait"
    jar = {COOKIE: resp.cookies[COOKIE]}
    client.cookies.clear()
    return jar


async def post_as(
    client: httpx.AsyncClient, cookie: dict[str, str], path: str, body: Any, headers: dict | None = None
) -> httpx.Response:
    """A call carrying one session's cookie (the client's jar holds just that cookie)."""
    client.cookies.clear()
    client.cookies.update(cookie)
    return await client.post(path, json=body, headers=headers or {})


def rewrite_record(location: str, committed: dict, record_index: int, mutate) -> None:
    """Change one stored record and keep the manifest's digests consistent (a valid file, a bad state)."""
    key = sorted(stored.records(location, committed["manifest_key"]))[record_index]

    def change(blob: bytes) -> bytes:
        payload = json.loads(blob)
        mutate(payload["state"])
        return json.dumps(payload).encode()  # NaN stays a bare NaN token, as a careless writer would emit

    stored.rewrite_record(location, committed["manifest_key"], key, change)


def _set(key: str, value: Any):
    def mutate(state: dict) -> None:
        state[key] = value

    return mutate


def _env_text(text: str):
    def mutate(state: dict) -> None:
        state["environment_json"] = text

    return mutate


CORRUPTIONS = {
    "schema_version": _set("schema_version", 3),
    "environment_not_text": _set("environment_json", {"patients": {}}),
    "environment_not_json": _env_text("{not json"),
    "environment_not_object": _env_text('["not", "an", "object"]'),
    "negative_counter": _set("next_id", -1),
    "counter_as_string": _set("next_id", "3"),
    "bad_id_seed": _set("id_seed", "zz"),
    "extra_field": _set("rng", 1),
    "missing_environment": lambda state: state.pop("environment_json"),
}


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
async def test_invalid_state_anywhere_in_batch_installs_nothing(
    storage_url: str, corruption: str, position: int
) -> None:
    async with serve(fresh_app()) as client:
        for task_index in (1, 3, 4):
            cookie = await seed(client, task_index)
            resp = await post_as(client, cookie, "/get_inbox" if task_index != 1 else "/get_messages", {})
            assert resp.status_code == 200
        committed = await Control(client).checkpoint("ck-bad", storage_url)
        assert committed["records"] == 3
    rewrite_record(storage_url, committed, position, CORRUPTIONS[corruption])

    async with serve(fresh_app()) as client:
        control = Control(client)
        refused = await control.restore("ck-bad", storage_url, committed["manifest_key"], expect=422)
        assert refused["error"]["code"] == "invalid_state"
        assert "invalid state" in refused["error"]["message"]
        status = await control.status()
        assert status["phase"] == "fresh" and status["live"] == {"sessions": 0}
        assert sessions_of(client).sessions == {}
        # the server keeps working
        cookie = await seed(client, 0)
        assert (await post_as(client, cookie, "/get_messages", {})).json() == {"output": "[]"}


def test_restore_hook_validates_all_before_installing_any() -> None:
    live = SessionStore()
    live.seed("a", TASKS[0]["environment"])
    good = live.export_session_states()["a"]
    target = SessionStore()
    target.seed("existing", TASKS[1]["environment"])
    before = copy.deepcopy(target.export_session_states())
    bad = {**good, "next_id": -5}
    with pytest.raises(InvalidState, match="session s2: invalid state: next_id"):
        target.restore_session_states({"s1": good, "s2": bad, "s3": good})
    assert target.export_session_states() == before
    target.restore_session_states({"s1": good, "s3": good})
    assert set(target.sessions) == {"existing", "s1", "s3"}


async def test_retired_session_gone_and_cookie_refused_while_other_keeps_working(tmp_path) -> None:
    async with serve(fresh_app()) as client:
        cookie_a = await seed(client, 1)
        cookie_b = await seed(client, 3)
        assert (await post_as(client, cookie_a, "/get_schedule", {"date": "2024-06-24"})).status_code == 200
        retired = await Control(client).retire("ipi-1", 0)
        assert retired["retired"] is True
        assert len(sessions_of(client).sessions) == 1
        # the cookie alone is refused, and so is the old identity
        for headers in ({}, ident(1, 0)):
            gone = await post_as(client, cookie_a, "/get_messages", {}, headers)
            assert gone.status_code == 409 and gone.json()["error"]["code"] == "stale_attempt"
        body = {"candidate_id": "C-4552", "status": "interviewing"}
        ok = await post_as(client, cookie_b, "/update_candidate_status", body, ident(3, 0))
        assert ok.json() == {"output": "Status updated for candidate C-4552 to 'interviewing'."}
        committed = await Control(client).checkpoint("ck1", f"file://{tmp_path}")
        assert committed["records"] == 1 and committed["episodes"] == ["ipi-3"]


async def test_failed_verify_drops_the_session_and_answers_like_nemo_gym(tmp_path, monkeypatch) -> None:
    app = fresh_app()

    def broken(*args, **kwargs):
        raise RuntimeError("verifier exploded")

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            cookie_a = await seed(client, 2)
            cookie_b = await seed(client, 4)
            monkeypatch.setattr(verifier, "score", broken)
            body = verify_body(TASKS[2], [], [])
            failed = await post_as(client, cookie_a, "/verify", body, ident(2, 0))
            assert failed.status_code == 500 and failed.json() == "RuntimeError('verifier exploded')"
            monkeypatch.undo()
            # the finally dropped the environment and the session with it, as NeMo Gym's does
            assert set(sessions_of(client).sessions) == {sid_of(client, cookie_b)}
            assert (await Control(client).status())["live"] == {"sessions": 1}
            committed = await Control(client).checkpoint("ck1", f"file://{tmp_path}")
            assert committed["records"] == 1 and committed["episodes"] == ["ipi-4"]
            again = await post_as(client, cookie_a, "/get_patient_record", {"patient_id": "P-7742"})
            assert again.status_code == 400 and again.json() == {"detail": NOT_SEEDED}


def sid_of(client: httpx.AsyncClient, cookie: dict[str, str]) -> str:
    return client._transport.app.state.session_codec.read(cookie[COOKIE])


def test_export_and_restore_do_not_alias_live_state() -> None:
    store = SessionStore()
    env = copy.deepcopy(TASKS[1]["environment"])
    session = store.seed("s", env)
    env["patients"]["P001"]["name"] = "changed by caller"  # seed kept its own copy
    assert session.environment["patients"]["P001"]["name"] == "Aisha Rahman"

    exported = store.export_session_states()
    session.environment["messages"].append({"to": "x"})
    assert json.loads(exported["s"]["environment_json"])["messages"] == []  # the export is a copy

    restored = SessionStore()
    states = store.export_session_states()
    restored.restore_session_states(states)
    states["s"]["next_id"] = 99
    assert restored.sessions["s"].environment["messages"] == [{"to": "x"}]
    assert restored.sessions["s"].next_id == 0
    restored.sessions["s"].environment["patients"]["P002"]["chart_notes"] = "restored changed"
    assert session.environment["patients"]["P002"]["chart_notes"].startswith("BP 138/86")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, "environment.current_user.extra holds a set"),
        ((1, 2), "environment.current_user.extra holds a tuple"),
        ({1: "x"}, "environment.current_user.extra has a int key 1"),
        ([object()], r"environment.current_user.extra\[0\] holds a object"),
    ],
)
def test_export_rejects_values_json_cannot_carry(value: Any, message: str) -> None:
    store = SessionStore()
    store.seed("s", TASKS[0]["environment"]).environment["current_user"]["extra"] = value
    with pytest.raises(NonJsonValue, match=f"session s: {message}"):
        store.export_session_states()


def test_non_finite_numbers_and_number_types_survive_export() -> None:
    """NaN and infinities parse from request bodies (as in NeMo Gym's server) and must survive a restore."""
    env = {"a": math.nan, "b": -math.inf, "c": 1, "d": 1.0, "e": -0.0, "f": 10**30, "g": "\ud800"}
    store = SessionStore()
    store.seed("s", env)
    restored = SessionStore()
    restored.restore_session_states(store.export_session_states())
    got = restored.sessions["s"].environment
    assert json.dumps(got) == json.dumps(store.sessions["s"].environment)
    assert [type(v) for v in got.values()] == [float, float, int, float, float, int, str]
    assert str(got["e"]) == "-0.0" and math.isnan(got["a"])


def test_records_of_schema_1_still_restore() -> None:
    """Records written before the environment was stored as text (schema 1) restore unchanged."""
    old = {
        "schema_version": 1,
        "environment": {"patients": {"P1": {"name": "N"}}, "messages": []},
        "id_seed": "0123456789abcdef",
        "next_id": 4,
    }
    store = SessionStore()
    store.restore_session_states({"s": old})
    session = store.sessions["s"]
    assert session.environment == old["environment"] and (session.id_seed, session.next_id) == ("0123456789abcdef", 4)
    with pytest.raises(InvalidState, match="invalid state"):
        store.restore_session_states({"t": {**old, "environment": {"x": math.nan}}})


async def test_commit_with_non_json_value_is_refused_then_server_recovers(tmp_path) -> None:
    async with serve(fresh_app()) as client:
        cookie = await seed(client, 0)
        sid = sid_of(client, cookie)
        sessions_of(client).sessions[sid].environment["patients"]["P001"]["tags"] = {"vip"}
        control = Control(client)
        assert (await control.prepare("ck1"))["status"] == "prepared"
        refused = await control.capture_persist("ck1", f"file://{tmp_path}", expect=422)
        assert refused["error"]["code"] == "invalid_state"
        assert "environment.patients.P001.tags holds a set" in refused["error"]["message"]
        await control.abort("ck1")
        del sessions_of(client).sessions[sid].environment["patients"]["P001"]["tags"]
        committed = await control.checkpoint("ck2", f"file://{tmp_path}")
        assert committed["records"] == 1


async def test_key_order_survives_checkpoint(tmp_path) -> None:
    """Tool outputs serialize the environment as stored, so key order must survive the round trip."""
    env = {
        "prescriptions": {},
        "patients": {
            "Z-9": {"zeta": 1, "patient_id": "Z-9", "name": "Zed", "alpha": [3, 1, 2], "conditions": ["b", "a"]},
            "A-1": {"name": "Ann", "patient_id": "A-1", "conditions": [], "mid": {"y": None, "x": 1.5, "w": -0.0}},
        },
        "messages": [],
        "appointments": {},
    }
    calls = [("search_patients", {"query": ""}), ("get_patient_record", {"patient_id": "Z-9"})]
    loc = f"file://{tmp_path}"
    async with serve(fresh_app()) as client:
        await client.post("/seed_session", json={"environment": env}, headers={"x-ng-rollout-id": "order"})
        cookies = dict(client.cookies)
        before = [(await client.post(f"/{n}", json=a)).content for n, a in calls]
        committed = await Control(client).checkpoint("ck1", loc)
    async with serve(fresh_app()) as client:
        control = Control(client)
        await control.restore("ck1", loc, committed["manifest_key"])
        await control.resume("ck1")
        client.cookies.update(cookies)
        headers = {"x-ng-rollout-id": "order", "x-ng-attempt": "1"}
        after = [(await client.post(f"/{n}", json=a, headers=headers)).content for n, a in calls]
        (session,) = sessions_of(client).sessions.values()
    assert after == before
    assert json.loads(before[1])["output"].startswith('{"zeta": 1, "patient_id": "Z-9"')
    assert list(session.environment) == list(env)
    assert list(session.environment["patients"]) == ["Z-9", "A-1"]


def test_minted_ids_come_from_checkpointed_counter() -> None:
    """Same environment, same counter -> same next ID; the counter is part of the state."""
    a = Session.seeded(TASKS[4]["environment"])
    first = [a.mint_id("I-") for _ in range(3)]
    assert all(len(i) == 8 and i[2:] == i[2:].upper() for i in first)
    b = Session.seeded(TASKS[4]["environment"])
    assert [b.mint_id("I-") for _ in range(3)] == first
    store = SessionStore()
    store.sessions["s"] = Session.seeded(TASKS[4]["environment"])
    store.sessions["s"].mint_id("I-")
    copy_store = SessionStore()
    copy_store.restore_session_states(store.export_session_states())
    assert copy_store.sessions["s"].mint_id("I-") == first[1]
