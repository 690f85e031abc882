"""A capture runs with cyclic garbage collection paused (full collections were ~40% of a large
capture under the pause), and collection is back on afterwards, whether the capture succeeded or failed; the heap
stays frozen from the collector from the capture until its persist ends or it is dropped (the first
full collection after resume walked every object of the server right when the parked calls retried)."""

from __future__ import annotations

import gc
from typing import Never

import pytest
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.participant import Capture, InvalidState, NothingToRestore, Participant, Record
from gym_services.server.app import create_server_app


class Capturing(NothingToRestore):
    role = "environment"

    def __init__(self) -> None:
        self.collecting: list[bool] = []
        self.fail = False
        self.made: list[list[list[int]]] = []  # a container each capture made (tracked by the collector)

    async def capture(self, scope):
        self.collecting.append(gc.isenabled())
        self.made.append([[len(self.made)]])
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


def collected(obj: object) -> bool:
    """Whether the collector walks ``obj``: it is in one of its generations, not frozen."""
    return any(o is obj for o in gc.get_objects())


async def test_the_heap_is_frozen_from_capture_until_its_persist_ends_or_it_is_dropped(plane, tmp_path) -> None:
    control, participant = plane
    location = f"file://{tmp_path}"
    assert gc.get_freeze_count() == 0
    await control.prepare("c1")
    await control.capture("c1", location)
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.collect()  # what collection catching up after the capture would walk: not what the capture made
    assert not collected(participant.made[-1])
    await control.resume("c1")
    assert gc.get_freeze_count() > 0 and not collected(participant.made[-1])  # the persist has not run yet
    await control.persist("c1")
    assert gc.get_freeze_count() == 0 and collected(participant.made[-1])

    await control.prepare("c2")
    await control.capture("c2", location)
    assert gc.get_freeze_count() > 0
    await control.abort("c2")  # the capture is dropped: nothing will persist it
    assert gc.get_freeze_count() == 0 and collected(participant.made[-1])

    participant.fail = True  # a failed capture takes no hold
    await control.prepare("c3")
    await control.capture("c3", location, expect=422)
    assert gc.get_freeze_count() == 0
    await control.abort("c3")


class Restoring(Participant[None, Never]):
    """One record to checkpoint; its validate notes whether collection runs (a restore keeps all it
    rebuilds, so every collection during it walked every session rebuilt so far)."""

    role = "environment"

    def __init__(self) -> None:
        self.collecting: list[bool] = []
        self.fail = False

    async def export(self, scope):
        return [Record("only", b"{}")]

    async def validate(self, records):
        self.collecting.append(gc.isenabled())
        if self.fail:
            raise InvalidState("cannot restore")

    async def install(self, validated) -> None:
        pass

    async def uninstall(self, validated) -> None:
        pass


async def test_collection_is_paused_while_a_restore_validates_only(tmp_path) -> None:
    location = f"file://{tmp_path}"
    source = create_server_app(load_config(ServerConfig, overrides=base_config("gc")), Restoring(), [])
    async with serve(source) as client:
        persisted = await Control(client).checkpoint("c1", location)
    for fail in (False, True):
        participant = Restoring()
        participant.fail = fail
        app = create_server_app(load_config(ServerConfig, overrides=base_config("gc")), participant, [])
        async with serve(app) as client:
            control = Control(client)
            assert gc.isenabled()
            answer = await control.restore(
                "c1", location, persisted["manifest_key"], persisted["manifest_sha256"], expect=422 if fail else 200
            )
            assert participant.collecting == [False] and gc.isenabled(), answer
            if fail:
                assert answer["error"]["code"] == "invalid_state"
            else:
                await control.resume("c1")
