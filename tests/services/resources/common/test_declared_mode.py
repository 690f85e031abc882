"""A declared mode that would lose what a server holds fails at prepare, before anything pauses, naming the server,
its mode and what it would lose (``docs/participants.md``); a participant whose hooks do not fit fails at start-up,
naming each missing or mismatched method with its signature."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import pytest
from starlette.routing import Route
from tests.services.resources.common.notebook import Notebook, notebook_app
from tests.support.asgi import TOKEN, Control, base_config, serve, serve_many

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.participant import NothingToRestore, RestoredRecord
from gym_services.control.protocol import CheckpointMode
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.resources.common import ExportedParticipant, StatelessParticipant
from gym_services.server.app import create_server_app

ANY = {"x-ng-rollout-id": "r1"}


async def test_stateless_on_a_server_holding_sessions_is_refused_at_prepare(tmp_path) -> None:
    async with serve(notebook_app(CheckpointMode.STATELESS)) as client:
        for _ in range(3):
            client.cookies.clear()
            await client.post("/seed_session", headers=ANY)
            await client.post("/put", json={"key": "k", "value": "v"}, headers=ANY)
        control = Control(client)
        refused = await control.prepare("ck", expect=422)
        message = refused["error"]["message"]
        assert refused["error"]["code"] == "invalid_state"
        assert "server notebook" in message and "checkpoint_mode stateless" in message and "3 sessions" in message
        status = await control.status()  # nothing paused, nothing lost
        assert status["phase"] == "fresh" and status["admission_open"] and status["checkpoint_id"] is None
        assert status["live"] == {"sessions": 3}
        assert (await client.post("/get", json={"key": "k"}, headers=ANY)).json() == {"value": "v"}


async def test_the_checkpoint_fails_with_that_error_and_the_stack_serves_on(tmp_path) -> None:
    apps = {"notebook": notebook_app(CheckpointMode.STATELESS)}
    refs = [ParticipantRef("notebook", "resources", "http://notebook")]
    async with (
        serve_many(apps) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://notebook") as http,
        ControlClient(TOKEN, transport=transport) as client,
    ):
        await http.post("/seed_session", headers=ANY)
        result = await Coordinator(refs, client).checkpoint("ck", f"file://{tmp_path}", prepare_timeout_s=5)
        assert (await http.post("/put", json={"key": "k", "value": "v"}, headers=ANY)).status_code == 200
    assert not result.completed
    assert "notebook" in result.error and "stateless" in result.error and "1 sessions" in result.error


def test_seeding_sessions_through_the_participant_is_holding_them_with_or_without_a_store() -> None:
    participant = StatelessParticipant()
    assert participant.mode_conflict() is None
    participant.seeded("s1", {"x-ng-rollout-id": "r1"})
    assert "it holds 1 sessions" in (participant.mode_conflict() or "")
    participant.end("s1")
    assert participant.mode_conflict() is None


async def test_a_stateless_server_that_seeds_no_sessions_is_checkpointed(tmp_path) -> None:
    async with serve(
        create_server_app(load_config(ServerConfig, overrides=base_config("verifier")), StatelessParticipant(), [])
    ) as client:
        persisted = await Control(client).checkpoint("ck", f"file://{tmp_path}")
        assert persisted["records"] == 0


class NoExport:
    def retire_session_state(self, session_id: str) -> None: ...


class WrongSignatures(Notebook):
    def stage_session_states(self) -> dict[str, dict[str, str]]:  # type: ignore[override]
        return {}

    async def install_session_states(self, staged: dict[str, dict[str, str]]) -> None:  # type: ignore[override]
        self.notes.update(staged)

    def capture_session_states(self) -> None: ...


def test_missing_hooks_are_named_with_their_signatures() -> None:
    with pytest.raises(TypeError) as missing:
        ExportedParticipant(NoExport())  # type: ignore[arg-type]
    message = str(missing.value)
    assert message.startswith("NoExport does not implement the session hooks of an exported server")
    assert "missing def export_session_states(self) -> Mapping[str, object]" in message
    assert "missing def stage_session_states(self, states: Mapping[str, object]) -> S" in message
    assert "missing def install_session_states(self, staged: S) -> None" in message
    assert "retire_session_state" not in message


def test_wrong_signatures_are_refused() -> None:
    with pytest.raises(TypeError) as wrong:
        ExportedParticipant(WrongSignatures())
    message = str(wrong.value)
    assert "stage_session_states() cannot be called as def stage_session_states(self, states" in message
    assert "install_session_states must be def install_session_states(self, staged: S) -> None" in message
    # one capture hook makes it a capturing store: the others are missing
    assert "missing def encode_captured_session(self, frozen: Any) -> object" in message


class SyncValidate(NothingToRestore):
    role = "resources"

    def validate(self, records: list[RestoredRecord]) -> None:  # type: ignore[override]
        """A plain function where the control plane awaits: a restore would never validate anything."""

    async def retire(self, rollout_id: str) -> bool:  # type: ignore[override]
        return False


def test_a_participant_with_mismatched_overrides_fails_at_start_up() -> None:
    config = load_config(ServerConfig, overrides=base_config("odd"))
    with pytest.raises(TypeError) as odd:
        create_server_app(config, SyncValidate(), [Route("/x", lambda r: None)])
    message = str(odd.value)
    assert message.startswith("SyncValidate does not fit the participant interface")
    assert "validate must be async def validate(self, records: list[RestoredRecord]) -> V" in message
    wanted = "async def retire(self, rollout_id: str, attempt: int) -> bool"
    assert f"retire(rollout_id: str) cannot be called as {wanted}" in message


def test_a_store_with_every_hook_is_taken(tmp_path) -> None:
    assert isinstance(ExportedParticipant(Notebook()).hooks, Notebook)

    class Shared(Notebook):
        def export_shared_states(self) -> Mapping[str, object]:
            return {}

    with pytest.raises(TypeError, match=r"stage_session_states\(states: Mapping\[str, object\]\) cannot be called"):
        ExportedParticipant(Shared())  # its stage hook does not take the shared states
