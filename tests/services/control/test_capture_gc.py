"""A capture runs with cyclic garbage collection paused (issue 14: full collections were ~40% of a large
capture under the pause), and collection is back on afterwards, whether the capture succeeded or failed."""

from __future__ import annotations

import gc

import pytest
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.participant import Capture, InvalidState, NothingToRestore
from gym_services.server.app import create_server_app


class Capturing(NothingToRestore):
    role = "environment"

    def __init__(self) -> None:
        self.collecting: list[bool] = []
        self.fail = False

    async def capture(self, scope):
        self.collecting.append(gc.isenabled())
        if self.fail:
            raise InvalidState("cannot capture")
        return Capture([])


@pytest.fixture
async def plane():
    participant = Capturing()
    app = create_server_app(load_config(ServerConfig, overrides=base_config("gc")), participant, [])
    async with serve(app) as client:
        yield Control(client), participant


async def test_collection_is_paused_during_capture_only(plane, tmp_path) -> None:
    control, participant = plane
    assert gc.isenabled()
    await control.prepare("c1")
    await control.call("capture", {"checkpoint_id": "c1", "location": f"file://{tmp_path}"})
    assert participant.collecting == [False] and gc.isenabled()
    await control.abort("c1")

    participant.fail = True
    await control.prepare("c2")
    failed = await control.call("capture", {"checkpoint_id": "c2", "location": f"file://{tmp_path}"}, expect=422)
    assert failed["error"]["code"] == "invalid_state"
    assert participant.collecting == [False, False] and gc.isenabled()
