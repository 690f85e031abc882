"""Servers reach storage only through the storage gateway, never with keys of their own.

The counter servers here are configured with a dead S3 endpoint, no keys, and the gateway's URL; the AWS variables
are unset. SeaweedFS checks every signature. The gateway (the operator's :mod:`gym_operator.gateway`, on a real
port) holds the keys and signs one object at a time for the grant each server got with its capture or restore
(``docs/decisions.md``, "Participants reach storage through presigned requests").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.support.asgi import TOKEN, base_config, serve, serve_many
from tests.support.ports import free_port
from tests.support.seaweed import SeaweedS3

from gym_services.base.config import StorageConfig, load_config
from gym_services.control.storage.gateway import (
    Access,
    Grant,
    GrantIssuer,
    GrantKind,
    GrantRefused,
    GrantSigner,
    Target,
)
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app
from gym_services.stack.objectstore import port_free

AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
)
KEY = b"the-release-gateway-key-0123456789"


def dead_endpoint() -> str:
    port = next(p for p in range(29100, 29200) if port_free(p))
    return f"http://127.0.0.1:{port}"


def counters(gateway_url: str | None) -> tuple[dict, list[ParticipantRef]]:
    storage = {"endpoint_url": dead_endpoint(), "region": "us-east-1", "gateway_url": gateway_url}
    apps = {
        name: counter_app(load_config(CounterConfig, overrides=base_config(name, storage=storage)))
        for name in ("counter-a", "counter-b")
    }
    return apps, [ParticipantRef(name, "resources", f"http://{name}") for name in apps]


def operator_config(seaweed: SeaweedS3) -> StorageConfig:
    return StorageConfig(
        endpoint_url=seaweed.endpoint,
        region="us-east-1",
        access_key_id=seaweed.access_key,
        secret_access_key=seaweed.secret_key,
    )


class SecretsOnly:
    """The one Kube call the gateway makes (a location's credential Secret), answering from a dict."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets, self.reads = secrets, 0

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        self.reads += 1
        return self.secrets[f"{namespace}/{name}"]


@contextlib.asynccontextmanager
async def gateway(seaweed: SeaweedS3, signer: GrantSigner) -> AsyncIterator[tuple[str, Any]]:
    """The operator's gateway on 127.0.0.1: its own keys in Secret ``ns/keys``, no default keys of its own."""
    pytest.importorskip("kopf")
    from gym_operator.gateway import Gateway, serve

    kube = SecretsOnly(
        {"ns/keys": {"AWS_ACCESS_KEY_ID": seaweed.access_key, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key}}
    )
    port = free_port()
    runner = await serve(Gateway(signer, kube, "ns", StorageConfig(region="us-east-1")), "127.0.0.1", port)  # type: ignore[arg-type]
    try:
        yield f"http://127.0.0.1:{port}", kube
    finally:
        await runner.cleanup()


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)


async def seed_and_bump(http: httpx.AsyncClient, name: str, rollout: str) -> dict[str, str]:
    ident = {"x-ng-rollout-id": rollout, "x-ng-attempt": "0"}
    http.cookies.clear()
    assert (await http.post(f"http://{name}/seed_session", json={"start": 5}, headers=ident)).status_code == 200
    assert (await http.post(f"http://{name}/increment", json={"by": 2}, headers=ident)).json()["output"] == 7
    return dict(http.cookies)


async def test_servers_checkpoint_and_restore_with_keys_held_only_by_the_gateway(
    seaweed: SeaweedS3, s3_bucket: str, no_aws_env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    location = f"s3://{s3_bucket}/gateway/{id(caplog)}"
    target = Target(url=location, endpoint=seaweed.endpoint, region="us-east-1", credential="keys")
    signer = GrantSigner(KEY)
    async with gateway(seaweed, signer) as (url, kube):
        apps, refs = counters(url)
        async with (
            serve_many(apps) as transport,
            ControlClient(TOKEN, transport=transport) as client,
            httpx.AsyncClient(transport=transport) as http,
        ):
            cookies = {name: await seed_and_bump(http, name, f"r-{name}") for name in apps}

            own_config = Coordinator(refs, client, storage_config=operator_config(seaweed))
            refused = await own_config.checkpoint("ck-own", location, prepare_timeout_s=5)
            assert refused.status == "failed" and "writing checkpoint ck-own failed" in (refused.error or "")

            forged = GrantIssuer(GrantSigner(b"not-the-release-gateway-key-000"), target)
            wrong = Coordinator(refs, client, storage_config=operator_config(seaweed), grants=forged)
            denied = await wrong.checkpoint("ck-forged", location, prepare_timeout_s=5)
            assert denied.status == "failed" and "did not sign" in (denied.error or ""), denied.error

            right = Coordinator(
                refs, client, storage_config=operator_config(seaweed), grants=GrantIssuer(signer, target)
            )
            done = await right.checkpoint("ck-right", location, prepare_timeout_s=5)
            assert done.status == "completed", done.error
            assert {p.participant_id: p.records for p in done.participants} == {"counter-a": 1, "counter-b": 1}
            assert kube.reads >= 1  # the gateway read the location's Secret; the servers never saw it

        fresh_apps, refs = counters(url)
        async with (
            serve_many(fresh_apps) as transport,
            ControlClient(TOKEN, transport=transport) as client,
            httpx.AsyncClient(transport=transport) as http,
        ):
            without = await Coordinator(refs, client, storage_config=operator_config(seaweed)).restore(
                "ck-right", location
            )
            assert without.status == "failed"  # the manifest is readable by the operator, not by the servers
            restored = await Coordinator(
                refs, client, storage_config=operator_config(seaweed), grants=GrantIssuer(signer, target)
            ).restore("ck-right", location)
            assert restored.status == "completed", restored.error
            for name in fresh_apps:
                http.cookies.clear()
                http.cookies.update(cookies[name])
                ident = {"x-ng-rollout-id": f"r-{name}", "x-ng-attempt": "1"}
                bumped = await http.post(f"http://{name}/increment", json={"by": 3}, headers=ident)
                assert bumped.json()["output"] == 10
                status = (
                    await http.get(
                        f"http://{name}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {TOKEN}"}
                    )
                ).text
                assert seaweed.secret_key not in status
    everything_logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert seaweed.secret_key not in everything_logged


async def test_the_store_refuses_what_the_gateway_did_not_sign(seaweed: SeaweedS3, s3_bucket: str) -> None:
    """SeaweedFS's S3 auth is on: an unsigned request fails, and a signed one serves only its own key and verb."""
    target = Target(url=f"s3://{s3_bucket}/signed", endpoint=seaweed.endpoint, region="us-east-1", credential="keys")
    signer = GrantSigner(KEY)
    token = GrantIssuer(signer, target).capture("ck-1", "p-1").token.get_secret_value()
    own = "checkpoints/ck-1/participants/p-1/packs/00000.pack"
    async with gateway(seaweed, signer) as (url, _), httpx.AsyncClient() as http:
        signed = (await http.post(f"{url}/storage/v1/sign", json={"token": token, "access": "put", "key": own})).json()
        assert (await http.put(signed["url"], content=b"pack")).status_code == 200
        unsigned = await http.put(f"{seaweed.endpoint}/{s3_bucket}/signed/{own}", content=b"forged")
        assert unsigned.status_code == 403
        other_key = signed["url"].replace("00000.pack", "00001.pack")
        assert (await http.put(other_key, content=b"elsewhere")).status_code == 403
        assert (await http.get(signed["url"])).status_code == 403  # signed for PUT, not GET
        other = "checkpoints/ck-1/participants/p-2/packs/00000.pack"
        refused = await http.post(f"{url}/storage/v1/sign", json={"token": token, "access": "put", "key": other})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "grant_refused"
        conditional = (
            await http.post(
                f"{url}/storage/v1/sign",
                json={
                    "token": token,
                    "access": "put_if_absent",
                    "key": "checkpoints/ck-1/participants/p-1/manifest.json",
                },
            )
        ).json()
        assert (await http.put(conditional["url"], content=b"{}", headers=conditional["headers"])).status_code == 200
        again = await http.put(conditional["url"], content=b"{}", headers=conditional["headers"])
        assert again.status_code == 412
        assert (await http.put(conditional["url"], content=b"overwrite")).status_code == 403  # its header is signed
        bad = await http.post(f"{url}/storage/v1/sign", json={"token": token, "access": "list", "key": own})
        assert bad.status_code == 400


T = Target(url="s3://bucket-a/p")
D = Target(url="s3://bucket-b/decisions")


def grant(kind: GrantKind, **extra: Any) -> Grant:
    fields = {"kind": kind, "target": T, "checkpoint_id": "ck-2", "participant_id": "p-1", "expires_at": 2e9}
    return Grant(**{**fields, **extra})


@pytest.mark.parametrize(
    ("kind", "access", "key", "where"),
    [
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/participants/p-1/packs/00003.pack", T),
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/participants/p-1/reuses.json", T),
        (GrantKind.CHECKPOINT, Access.PUT_IF_ABSENT, "checkpoints/ck-2/participants/p-1/manifest.json", T),
        (GrantKind.CHECKPOINT, Access.HEAD, "checkpoints/ck-1/participants/p-1/packs/00000.pack", T),  # reused
        (GrantKind.CHECKPOINT, Access.HEAD, "checkpoints/ck-1/manifest.json", T),  # is it published?
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/participants/p-2/packs/00000.pack", None),
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-1/participants/p-1/packs/00000.pack", None),
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/manifest.json", None),  # publishing is the operator's
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/claim.json", None),
        (GrantKind.CHECKPOINT, Access.GET, "checkpoints/ck-1/participants/p-1/packs/00000.pack", None),
        (GrantKind.CHECKPOINT, Access.PUT, "checkpoints/ck-2/participants/p-1/packs/3.pack", None),
        (GrantKind.CHECKPOINT, Access.PUT, "elsewhere/secret.txt", None),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-2/participants/p-1/manifest.json", T),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-1/participants/p-1/packs/00000.pack", T),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-2/participants/p-1/records/a.json", T),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-2/restores/r-1.json", D),
        (GrantKind.RESTORE, Access.PUT_IF_ABSENT, "checkpoints/ck-2/restores/r-1.json", D),
        (GrantKind.RESTORE, Access.PUT, "checkpoints/ck-2/restores/r-1.json", None),  # never overwrites a decision
        (GrantKind.RESTORE, Access.PUT_IF_ABSENT, "checkpoints/ck-2/restores/r-2.json", None),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-2/participants/p-2/manifest.json", None),
        (GrantKind.RESTORE, Access.GET, "checkpoints/ck-1/participants/p-1/manifest.json", None),
        (GrantKind.RESTORE, Access.PUT, "checkpoints/ck-2/participants/p-1/packs/00000.pack", None),
    ],
)
def test_a_grant_covers_its_own_objects_only(kind: GrantKind, access: Access, key: str, where: Target | None) -> None:
    g = grant(kind, restore_id="r-1", decisions=D) if kind is GrantKind.RESTORE else grant(kind)
    if where is None:
        with pytest.raises(GrantRefused):
            g.target_for(access, key)
    else:
        assert g.target_for(access, key) == where


def test_tokens_are_checked_before_anything_is_signed() -> None:
    signer = GrantSigner(KEY)
    token = signer.issue(grant(GrantKind.CHECKPOINT)).token.get_secret_value()
    assert signer.verify(token).participant_id == "p-1"
    mac = token.split(".")[1]
    with pytest.raises(GrantRefused, match="signature"):
        GrantSigner(b"another-release-key-0123456789").verify(token)
    other = GrantSigner(KEY).issue(grant(GrantKind.CHECKPOINT, participant_id="p-9")).token.get_secret_value()
    with pytest.raises(GrantRefused, match="signature"):
        signer.verify(f"{other.split('.')[0]}.{mac}")  # another grant's payload under this one's signature
    with pytest.raises(GrantRefused, match="expired"):
        signer.verify(signer.issue(grant(GrantKind.CHECKPOINT, expires_at=time.time() - 1)).token.get_secret_value())
    assert "p-1" not in repr(signer.issue(grant(GrantKind.CHECKPOINT)))  # the token prints masked


@pytest.mark.parametrize(
    "storage",
    [
        {"endpoint_url": "http://attacker.example:9000"},
        {"access_key_id": "AKIA", "secret_access_key": "s"},
        {"token": "short"},
        {"token": 5},
        "s3://a-string-instead",
    ],
)
async def test_a_request_naming_an_endpoint_or_keys_is_400_and_changes_nothing(storage, tmp_path) -> None:
    from tests.support.asgi import Control

    app = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    async with serve(app) as http:
        control = Control(http)
        await control.prepare("ck-1")
        bad = await control.call(
            "capture", {"checkpoint_id": "ck-1", "location": f"file://{tmp_path}", "storage": storage}, expect=400
        )
        assert bad["error"]["code"] == "bad_request" and "storage" in bad["error"]["message"]
        assert (await control.status())["phase"] == "prepared"
        assert not any(tmp_path.iterdir())
        assert (await control.capture_persist("ck-1", f"file://{tmp_path}"))["records"] == 0


async def test_a_grant_to_a_server_without_a_gateway_is_400() -> None:
    from tests.support.asgi import Control

    app = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    token = GrantIssuer(GrantSigner(KEY), T).capture("ck-1", "counter").token.get_secret_value()
    async with serve(app) as http:
        control = Control(http)
        await control.prepare("ck-1")
        bad = await control.call(
            "capture", {"checkpoint_id": "ck-1", "location": "s3://bucket-a/p", "storage": {"token": token}}, expect=400
        )
        assert "no storage gateway configured" in bad["error"]["message"]
        assert (await control.status())["phase"] == "prepared"
