"""resources/common: one participant class per checkpoint mode, a validate that changes nothing,
one session lookup and one seed helper (with the counter's store as the server's)."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from gym_services.base.errors import ApiError
from gym_services.base.sessions import SESSION_SCOPE_KEY
from gym_services.control.participant import InvalidState, RestoredRecord, Scope
from gym_services.control.protocol import VERIFY_HEADER, CheckpointMode, VerifyMode
from gym_services.resources.common import (
    ExportedParticipant,
    RestartOnlyParticipant,
    StatelessParticipant,
    participant_for,
)
from gym_services.resources.counter.app import STATE_VERSION, CounterSessions


def request(sid: str, **headers: str) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "state": {SESSION_SCOPE_KEY: sid},
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope)


def record(sid: str, value: object, rollout: str = "r1", attempt: int = 0) -> RestoredRecord:
    payload = {"schema_version": 1, "session_id": sid, "state": {"version": STATE_VERSION, "value": value}}
    return RestoredRecord(f"session-{sid}", json.dumps(payload).encode(), rollout, attempt)


async def test_the_mode_is_the_class() -> None:
    store = CounterSessions()
    assert type(participant_for(CheckpointMode.EXPORTED, store)) is ExportedParticipant
    restart = participant_for(CheckpointMode.RESTART_ONLY, store)
    assert type(restart) is RestartOnlyParticipant and restart.checkpoint_mode is CheckpointMode.RESTART_ONLY
    await restart.seed(request("s1", x_ng_rollout_id="r1"), lambda sid: store.seed(sid, 1))
    assert [b.id for b in restart.blockers()] == ["s1"] and await restart.export(Scope()) == []
    with pytest.raises(InvalidState, match="restart_only server cannot restore 1 records"):
        await restart.validate([record("s1", 2)])
    stateless = StatelessParticipant(verify=VerifyMode.REPLAY)
    assert stateless.blockers() == [] and stateless.seed_headers() == {VERIFY_HEADER: "replay"}
    with pytest.raises(TypeError, match="session hooks"):
        ExportedParticipant(object())  # type: ignore[arg-type]


async def test_validate_changes_nothing_and_install_puts_it_in_place() -> None:
    store = CounterSessions()
    participant = ExportedParticipant(store)
    staged = await participant.validate([record("s1", 7), record("s2", 9, "r2", 3)])
    assert store.values == {} and participant.sessions == {}  # nothing installed yet
    with pytest.raises(InvalidState, match="value must be an integer"):
        await participant.validate([record("s3", 1), record("s4", "not a number")])
    assert store.values == {}
    await participant.install(staged)
    assert store.values == {"s1": 7, "s2": 9}
    assert {sid: (i.rollout_id, i.attempt) for sid, i in participant.sessions.items()} == {
        "s1": ("r1", 1),
        "s2": ("r2", 4),
    }
    await participant.uninstall(staged)
    assert store.values == {} and participant.sessions == {}


async def test_one_session_lookup_and_one_seed_helper() -> None:
    store = CounterSessions()
    participant = ExportedParticipant(store)
    sid = await participant.seed(request("s1", x_ng_rollout_id="r1", x_ng_attempt="0"), lambda sid: store.seed(sid, 4))
    assert sid == "s1" and participant.session(request("s1"), store.values.get) == ("s1", 4)
    with pytest.raises(ApiError) as missing:
        participant.session(request("nope"), store.values.get)
    assert missing.value.code == "session_not_found"
    with pytest.raises(LookupError):
        participant.session(request("nope"), store.values.get, missing=lambda sid: LookupError(sid))
    assert await participant.retire("r1", 0) is True and store.values == {}
    with pytest.raises(ApiError) as retired:
        participant.session(request("s1"), store.values.get)
    assert retired.value.code == "stale_attempt"
