"""A checkpoint published by the old ``sync`` writer (ce41d67: plain JSON manifests, one object per record)
is still restored, into fresh servers, and its sessions continue where they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
from tests.support.asgi import TOKEN, base_config, serve_many

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.participant import NothingToRestore
from gym_services.control.protocol import Role
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app
from gym_services.server.app import create_server_app

FIXTURE = Path(__file__).parents[2] / "fixtures" / "v1_checkpoint"


class Agent(NothingToRestore):
    role = Role.AGENT


async def test_restores_a_checkpoint_written_by_the_v1_sync_writer(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / "store", tmp_path / "store")
    location = f"file://{tmp_path / 'store'}"
    sessions = json.loads((FIXTURE / "sessions.json").read_text())
    store = CheckpointStore(open_storage(location))
    manifest = store.published("v1-ck")
    assert manifest is not None and manifest.schema_version == 1 and manifest.method == "sync"

    apps = {
        "counter": counter_app(load_config(CounterConfig, overrides=base_config("counter"))),
        "agent": create_server_app(load_config(ServerConfig, overrides=base_config("agent")), Agent(), []),
    }
    refs = [
        ParticipantRef("counter", Role.RESOURCES, "http://counter"),
        ParticipantRef("agent", Role.AGENT, "http://agent"),
    ]
    async with serve_many(apps) as transport:
        client = ControlClient(TOKEN, transport=transport)
        try:
            result = await Coordinator(refs, client).restore("v1-ck", location)
        finally:
            await client.aclose()
        assert result.status == "completed", result.error
        assert result.records == 2 and result.episodes == {"r1": 1, "r2": 1}
        for rollout, session in sessions.items():
            async with httpx.AsyncClient(
                transport=transport, base_url="http://counter", cookies=session["cookies"]
            ) as http:
                ident = {"x-ng-rollout-id": rollout, "x-ng-attempt": "1"}
                answer = await http.post("/increment", json={"by": 1}, headers=ident)
                assert answer.status_code == 200, answer.text
                assert answer.json()["output"] == session["value"] + 1
