"""A captured checkpoint is written when the coordinator asks for it, not at this participant's own resume.

The coordinator sends ``persist`` once every participant has answered ``resume``; an upload that started at
each participant's own resume took the CPU the others needed to answer theirs (the pause ends only with the
last answer). A job nobody asks for starts by itself after ``PERSIST_START_GRACE_S``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.control import persists
from gym_services.resources.workplace_assistant.app import Config, create_app

IDENT = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}


def app():
    return create_app(load_config(Config, overrides=base_config("workplace_assistant")))


def written(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()) if store.exists() else []


async def captured_and_resumed(client, location: str) -> Control:
    control = Control(client)
    assert (await client.post("/seed_session", json={}, headers=IDENT)).status_code == 200
    assert (await control.prepare("ck"))["status"] == "prepared"
    await control.call("capture", {"checkpoint_id": "ck", "location": location, "episodes": ["r1"]})
    await control.resume("ck")
    return control


async def test_resume_queues_the_upload_and_persist_starts_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(persists, "PERSIST_START_GRACE_S", 30.0)
    store = tmp_path / "store"
    async with serve(app()) as client:
        control = await captured_and_resumed(client, f"file://{store}")
        await asyncio.sleep(0.3)  # time enough for a thread to have encoded and written one session
        status = await control.status()
        assert status["admission_open"] and status["persist"]["state"] == "queued", status
        assert not [k for k in written(store) if "/participants/" in k], written(store)
        answer = await control.call("persist", {"checkpoint_id": "ck"})
        assert answer["records"] == 2
        assert (await control.status())["persist"]["state"] == "persisted"
        assert any("/participants/" in k and k.endswith("manifest.json") for k in written(store)), written(store)


async def test_a_queued_upload_nobody_asks_for_starts_after_the_grace(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(persists, "PERSIST_START_GRACE_S", 0.2)
    async with serve(app()) as client:
        control = await captured_and_resumed(client, f"file://{tmp_path / 'store'}")
        for _ in range(100):  # bounded: 10 s
            if (await control.status())["persist"]["state"] == "persisted":
                break
            await asyncio.sleep(0.1)
        assert (await control.status())["persist"]["state"] == "persisted"
        assert (await control.call("persist", {"checkpoint_id": "ck"}))["records"] == 2  # the same answer


async def test_abort_of_a_queued_upload_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(persists, "PERSIST_START_GRACE_S", 30.0)
    store = tmp_path / "store"
    async with serve(app()) as client:
        control = await captured_and_resumed(client, f"file://{store}")
        await control.abort("ck")
        for _ in range(50):
            if (await control.status())["persist"]["state"] != "queued":
                break
            await asyncio.sleep(0.05)
        assert (await control.status())["persist"]["state"] == "cancelled"
        refused = await control.call("persist", {"checkpoint_id": "ck"}, expect=None)
        assert refused["error"]["code"] == "unknown_checkpoint", refused
        assert not [k for k in written(store) if "/participants/" in k], written(store)
