"""Checkpoints of Workplace sessions with the default method: the capture is frozen, an incremental checkpoint
reuses what did not change and restores exactly what a full one restores, and deletion can tell what others still
read (docs/protocol.md, "Records and manifests")."""

from __future__ import annotations

import httpx
from tests.support.asgi import TOKEN, base_config, serve_many

from gym_services.base.config import load_config
from gym_services.control import layout
from gym_services.control.retention import Retention
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.resources.workplace_assistant.app import Config, create_app
from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions
from gym_services.resources.workplace_assistant.tools import call_tool

SESSIONS = 10
SEND = ("email_send_email", {"recipient": "nadia.moreau@atlas.com", "subject": "Status", "body": "On track."})
MOVE = ("project_management_update_task", {"task_id": "00000000", "field": "list_name", "new_value": "Done"})
LATER = ("email_send_email", {"recipient": "lena.schmidt@atlas.com", "subject": "Later", "body": "One more."})


def workplace():
    return create_app(load_config(Config, overrides=base_config("workplace")))


def store_of(app) -> WorkplaceSessions:
    return app.state.participant.hooks


def test_a_capture_is_frozen_while_its_session_goes_on() -> None:
    sessions = WorkplaceSessions()
    env = sessions.seed("s1")
    call_tool(env, *SEND)
    before = sessions.export_session_states()["s1"]
    capture = sessions.capture_session_states()
    token, frozen = capture.sessions["s1"]
    call_tool(env, *LATER)  # after the capture, before it is encoded (the background upload)
    call_tool(env, *MOVE)
    assert sessions.encode_captured_session(frozen) == before  # the capture holds the state at capture time ...
    assert sessions.export_session_states()["s1"] != before  # ... and the session has moved on
    again = sessions.capture_session_states()
    assert again.sessions["s1"][0] != token  # changed since the capture: encoded again next time
    assert sessions.capture_session_states().sessions["s1"][0] == again.sessions["s1"][0]  # untouched: same token


async def call(http: httpx.AsyncClient, cookies: dict, rollout: str, attempt: int, tool: tuple[str, dict]) -> None:
    http.cookies.clear()
    http.cookies.update(cookies)
    answer = await http.post(
        f"http://workplace/{tool[0]}", json=tool[1], headers={"x-ng-rollout-id": rollout, "x-ng-attempt": str(attempt)}
    )
    assert answer.status_code == 200, answer.text


async def test_incremental_checkpoint_reuses_unchanged_records_and_restores_like_a_full_one(storage_url) -> None:
    refs = [ParticipantRef("workplace", "resources", "http://workplace")]
    original = workplace()
    cookies: dict[str, dict] = {}
    async with (
        serve_many({"workplace": original}) as transport,
        ControlClient(TOKEN, transport=transport) as client,
        httpx.AsyncClient(transport=transport) as http,
    ):
        for i in range(SESSIONS):
            http.cookies.clear()
            seeded = await http.post("http://workplace/seed_session", json={}, headers={"x-ng-rollout-id": f"r{i}"})
            assert seeded.status_code == 200
            cookies[f"r{i}"] = dict(http.cookies)
            await call(http, cookies[f"r{i}"], f"r{i}", 0, SEND if i % 2 else MOVE)
        coordinator = Coordinator(refs, client)
        full = await coordinator.checkpoint("ck-1", storage_url, prepare_timeout_s=5)
        assert full.status == "completed" and full.reused == 0, full
        await call(http, cookies["r3"], "r3", 0, LATER)  # 1 of 10 sessions changes
        incremental = await coordinator.checkpoint("ck-2", storage_url, prepare_timeout_s=5)
        reference = await coordinator.checkpoint("ck-2-sync", storage_url, prepare_timeout_s=5, method="sync")
        assert incremental.status == "completed" and reference.status == "completed", (incremental, reference)
        expected = store_of(original).export_session_states()

    # 9 unchanged sessions and the shared base are referenced in ck-1's pack, only r3 is written again
    assert incremental.records == SESSIONS + 1 and incremental.reused == SESSIONS
    assert incremental.written_bytes < 0.3 * full.written_bytes, (incremental.written_bytes, full.written_bytes)
    assert full.objects == 3  # one pack, the participant and the global manifest
    assert incremental.objects == 4  # and the reuse intent naming ck-1's pack
    storage = open_storage(storage_url)
    ck1_pack = layout.pack_key("ck-1", "workplace", 0)
    assert ck1_pack in Retention(CheckpointStore(storage)).objects_read_by("ck-2")
    # the sync method takes the same path (it only resumes later): nothing changed since ck-2, everything is reused
    assert reference.reused == SESSIONS + 1 and reference.objects == 3  # the reuse intent and two manifests
    kept = Retention(CheckpointStore(storage)).kept_for_others("ck-1")
    assert list(kept) == [ck1_pack] and "ck-2" in kept[ck1_pack]  # deleting ck-1 must keep its pack
    assert Retention(CheckpointStore(storage)).kept_for_others("ck-2-sync") == {}

    restored: dict[str, dict] = {}
    for cid in ("ck-2", "ck-2-sync", "ck-1"):
        fresh = workplace()
        async with (
            serve_many({"workplace": fresh}) as transport,
            ControlClient(TOKEN, transport=transport) as client,
        ):
            result = await Coordinator(refs, client).restore(cid, storage_url)
            assert result.status == "completed", result.error
            assert result.episodes == {f"r{i}": 1 for i in range(SESSIONS)}
        restored[cid] = store_of(fresh).export_session_states()
    assert restored["ck-2"] == restored["ck-2-sync"] == expected  # incremental = the live state, by either method
    r3 = next(sid for sid, ident in original.state.participant.sessions.items() if ident and ident.rollout_id == "r3")
    assert restored["ck-1"][r3] != expected[r3]  # r3's later call is not in ck-1 ...
    assert {k: v for k, v in restored["ck-1"].items() if k != r3} == {k: v for k, v in expected.items() if k != r3}
