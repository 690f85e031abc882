"""Nothing under a checkpoint's pause touches storage or makes a storage client.

The first checkpoint of a fresh server on S3 paused 1.2-2.9 s: ``capture`` made the boto3 client (import,
service model, credentials) while every rollout waited. Now the server makes its client at start-up and
a location is only parsed under the pause; the records are read and written after resume.

A tap on the real backends (``file://`` and SeaweedFS) records every storage request and every botocore
client made, with the plane's phase at that moment: none may fall in a paused phase. The tap delegates
to the real code; the test fails on a capture that opens its client (the code before this change).
"""

from __future__ import annotations

import threading

import botocore.session
import pytest
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.control.protocol import Phase
from gym_services.control.storage.file import FileStorage
from gym_services.control.storage.gateway import GatewayStorage, GrantIssuer, GrantSigner, Target
from gym_services.control.storage.s3 import S3Storage
from gym_services.resources.workplace_assistant.app import Config, create_app

PAUSED = {Phase.PREPARING, Phase.PREPARED, Phase.BLOCKED, Phase.CAPTURED}
REQUESTS = ("put", "put_if_absent", "get", "exists", "size", "list", "delete")


class Tap:
    """Every storage request and botocore client made in this process, with the plane's phase then."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plane = None
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        for cls in (FileStorage, S3Storage, GatewayStorage):
            for name in REQUESTS:
                monkeypatch.setattr(cls, name, self._wrap(f"{cls.__name__}.{name}", getattr(cls, name)))
        monkeypatch.setattr(
            botocore.session.Session,
            "create_client",
            self._wrap("botocore client", botocore.session.Session.create_client),
        )

    def _wrap(self, what: str, real):
        def tapped(*args, **kwargs):
            with self._lock:
                self.seen.append((what, self.plane.phase if self.plane is not None else "starting"))
            return real(*args, **kwargs)

        return tapped

    def paused(self) -> list[tuple[str, str]]:
        return [(what, phase) for what, phase in self.seen if phase in PAUSED]


async def first_checkpoint(tap: Tap, location: str, access: dict | None = None, gateway: str | None = None) -> dict:
    """A fresh server: one session, then its first background checkpoint (prepare, capture, resume, persist)."""
    storage = {"storage": {"gateway_url": gateway}} if gateway else {}
    app = create_app(load_config(Config, overrides=base_config("workplace_assistant", **storage)))
    tap.plane = app.state.plane
    async with serve(app) as client:
        control = Control(client)
        ident = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}
        assert (await client.post("/seed_session", json={}, headers=ident)).status_code == 200
        assert (await control.prepare("ck"))["status"] == "prepared"
        body = {"checkpoint_id": "ck", "location": location, "episodes": ["r1"]}
        if access is not None:
            body["storage"] = access
        await control.call("capture", body)
        await control.resume("ck")
        return await control.call("persist", {"checkpoint_id": "ck"})


async def test_file_checkpoint_touches_storage_only_after_resume(tmp_path, monkeypatch) -> None:
    tap = Tap(monkeypatch)
    persisted = await first_checkpoint(tap, f"file://{tmp_path / 'store'}")
    assert persisted["records"] == 2
    assert tap.paused() == []
    assert any(what == "FileStorage.put_if_absent" for what, _ in tap.seen), tap.seen  # the tap saw the persist


async def test_s3_client_is_made_at_start_up_not_under_the_pause(s3_location, monkeypatch) -> None:
    tap = Tap(monkeypatch)
    persisted = await first_checkpoint(tap, s3_location)
    assert persisted["records"] == 2
    assert tap.paused() == []
    clients = [phase for what, phase in tap.seen if what == "botocore client"]
    assert clients == [Phase.FRESH], tap.seen  # one, made at start-up, shared by every location
    assert any(what == "S3Storage.put_if_absent" for what, _ in tap.seen), tap.seen


async def test_a_grant_signs_and_writes_only_after_resume(s3_location, seaweed, monkeypatch) -> None:
    """A capture carrying a storage grant opens a gateway location under the pause (no request, no client); its
    objects are signed by the gateway and written by the background persist, after resume."""
    pytest.importorskip("kopf")
    from tests.support.ports import free_port

    from gym_operator.gateway import Gateway, serve
    from gym_services.base.config import StorageConfig

    tap = Tap(monkeypatch)
    key = b"the-release-gateway-key-0123456789"
    keys = StorageConfig(
        endpoint_url=seaweed.endpoint,
        region="us-east-1",
        access_key_id=seaweed.access_key,
        secret_access_key=seaweed.secret_key,
    )
    port = free_port()
    runner = await serve(Gateway(GrantSigner(key), None, "ns", keys), "127.0.0.1", port)  # type: ignore[arg-type]
    try:
        grant = GrantIssuer(GrantSigner(key), Target(url=s3_location)).capture("ck", "workplace_assistant")
        access = {"token": grant.token.get_secret_value()}
        persisted = await first_checkpoint(tap, s3_location, access, gateway=f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert persisted["records"] == 2
    assert tap.paused() == []
    assert any(what == "GatewayStorage.put_if_absent" for what, _ in tap.seen), tap.seen  # through the gateway
    assert not any(what.startswith("S3Storage") for what, _ in tap.seen), tap.seen  # never with keys of its own
