"""Servers outside the stack: an external participant is checked and checkpointed through its control routes; a
server outside the stack that is not a participant, named by URL in a config, is refused (stack/external.py)."""

from __future__ import annotations

import asyncio
import http.server
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from gym_services.authoring.processes import Launch, started
from gym_services.base.config import ConfigError
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator
from gym_services.stack.config import StackConfig, load_stack
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import StackError, stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def stack(servers: dict) -> StackConfig:
    return StackConfig.model_validate({"name": "outside", "state_dir": "state", "servers": servers})


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"server": "counter", "external": "http://127.0.0.1:9"}, "give `server`"),
        ({}, "give `server`"),
        ({"external": "http://127.0.0.1:9", "port": 8000}, "has no replicas, port or config"),
        ({"external": "127.0.0.1:9"}, "external"),
    ],
)
def test_an_external_server_is_a_url_and_nothing_the_stack_starts(tmp_path, spec, message) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "servers": {"a": spec}}))
    with pytest.raises(ConfigError, match=message):
        load_stack(path)


class NotAParticipant(http.server.BaseHTTPRequestHandler):
    """A server that answers every path 404 (no control routes), as a server not adapted does."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def plain_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotAParticipant)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_named_by_url_that_is_not_a_participant_is_refused(tmp_path, plain_server) -> None:
    config = {"model_url": "http://127.0.0.1:9", "model": "m", "resources_url": plain_server}
    with pytest.raises(StackError, match=r"is not a checkpoint participant .* participant: false"):
        start_stack(stack({"agent": {"server": "simple_agent", "config": config}}), tmp_path)
    with pytest.raises(StackError, match=r"external server env .* is not a checkpoint participant"):
        start_stack(stack({"env": {"external": plain_server}}), tmp_path)
    # declared as keeping nothing between calls, it may run beside the stack (and is not checkpointed)
    state = start_stack(stack({"env": {"external": plain_server, "participant": False}}), tmp_path)
    try:
        assert [(s.name, s.participant) for s in state.external] == [("env", False)]
    finally:
        stop_stack(Path(state.state_dir))


async def test_an_external_participant_is_checkpointed_through_its_control_routes(tmp_path) -> None:
    token = stack_secrets(tmp_path / "state")["control_token"]  # the stack's token, made before its first `up`
    launch = Launch("counter", {"name": "counter"}, tmp_path / "outside", "elsewhere", token, "s" * 32)
    with started(launch, "elsewhere") as outside:
        async with httpx.AsyncClient(base_url=outside.url) as http:
            seeded = await http.post("/seed_session", json={"start": 5}, headers={"x-ng-rollout-id": "r1"})
            assert seeded.status_code == 200
        state = start_stack(stack({"elsewhere": {"external": outside.url}}), tmp_path)
        try:
            async with ControlClient(token) as client:
                participants = await discover(state, client)
                assert [(p.participant_id, p.url) for p in participants] == [("elsewhere", outside.url)]
                result = await Coordinator(participants, client).checkpoint("c1", state.storage)
            assert result.completed, result.error
            assert [(p.participant_id, p.records) for p in result.participants] == [("elsewhere", 1)]
        finally:
            await asyncio.to_thread(stop_stack, Path(state.state_dir))
