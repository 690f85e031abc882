"""The control client speaks the control plane's own models on both ends of the wire."""
from __future__ import annotations

import json

import httpx
import pytest

from gym_services.control.models import (
    CheckpointRef,
    CommitRequest,
    PrepareRequest,
    PrepareResponse,
    StatusResponse,
    StorageAccess,
)
from gym_services.control.protocol import CONTROL_PREFIX, Phase, Role, Verb
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app
from gym_services.base.config import load_config
from tests.support.asgi import TOKEN, base_config, serve_many

REF = ParticipantRef("counter", Role.RESOURCES, "http://counter")


async def test_one_typed_method_per_verb_against_a_real_server() -> None:
    app = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    async with serve_many({"counter": app}) as transport, ControlClient(TOKEN, transport=transport) as client:
        status = await client.status(REF)
        assert isinstance(status, StatusResponse) and status.phase is Phase.FRESH and status.role is Role.RESOURCES
        prepared = await client.prepare(REF, PrepareRequest(checkpoint_id="ck-1", deadline_s=5))
        assert isinstance(prepared, PrepareResponse) and prepared.status is Phase.PREPARED
        with pytest.raises(ParticipantError) as refused:
            await client.prepare(REF, PrepareRequest(checkpoint_id="ck-2", deadline_s=5))
        assert refused.value.status == 409 and refused.value.code == "checkpoint_busy" and refused.value.verb is Verb.PREPARE
        resumed = await client.abort(REF, CheckpointRef(checkpoint_id="ck-1"))
        assert resumed.phase is Phase.OPEN


async def test_requests_carry_storage_keys_in_clear_and_answers_are_validated() -> None:
    seen: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, "body": json.loads(request.content)})
        return httpx.Response(200, json={"checkpoint_id": "ck-1"})  # not a CommitResponse

    access = StorageAccess(endpoint_url="http://s3:9000", access_key_id="ak", secret_access_key="sk")
    async with ControlClient(TOKEN, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ParticipantError, match="malformed CommitResponse"):
            await client.commit(REF, CommitRequest(checkpoint_id="ck-1", location="file:///x", storage=access))
        with pytest.raises(TypeError, match="CommitRequest"):
            await client.commit(REF, CheckpointRef(checkpoint_id="ck-1"))  # type: ignore[arg-type]
    assert seen == [{
        "path": f"{CONTROL_PREFIX}/commit",
        "body": {"checkpoint_id": "ck-1", "location": "file:///x",
                 "storage": {"endpoint_url": "http://s3:9000", "access_key_id": "ak", "secret_access_key": "sk"}},
    }]
    assert "sk" not in access.model_dump_json()  # anywhere else the keys stay masked
