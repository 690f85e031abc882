"""A checkpoint's own storage access travels to every server with capture and restore.

The counter servers here are configured with a dead S3 endpoint and no keys, and the AWS
variables are unset: they can only reach SeaweedFS (which checks signatures) through the
``storage`` field the coordinator sends, as the operator does for a Checkpoint naming its own
endpoint and credentials Secret.
"""

from __future__ import annotations

import logging

import httpx
import pytest
from tests.support.asgi import TOKEN, base_config, serve_many
from tests.support.seaweed import SeaweedS3

from gym_services.base.config import StorageConfig, load_config
from gym_services.control.models import StorageAccess
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


def dead_endpoint() -> str:
    port = next(p for p in range(29100, 29200) if port_free(p))
    return f"http://127.0.0.1:{port}"


def counters() -> tuple[dict, list[ParticipantRef]]:
    storage = {"endpoint_url": dead_endpoint(), "region": "us-east-1"}
    apps = {
        name: counter_app(load_config(CounterConfig, overrides=base_config(name, storage=storage)))
        for name in ("counter-a", "counter-b")
    }
    return apps, [ParticipantRef(name, "resources", f"http://{name}") for name in apps]


def access(seaweed: SeaweedS3, secret: str | None = None) -> StorageAccess:
    return StorageAccess(
        endpoint_url=seaweed.endpoint,
        region="us-east-1",
        access_key_id=seaweed.access_key,
        secret_access_key=secret or seaweed.secret_key,
    )


def coordinator_config(seaweed: SeaweedS3) -> StorageConfig:
    return StorageConfig(
        endpoint_url=seaweed.endpoint,
        region="us-east-1",
        access_key_id=seaweed.access_key,
        secret_access_key=seaweed.secret_key,
    )


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


async def test_servers_reach_storage_only_through_the_access_sent_with_the_checkpoint(
    seaweed: SeaweedS3, s3_bucket: str, no_aws_env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    location = f"s3://{s3_bucket}/access/{id(caplog)}"
    apps, refs = counters()
    async with (
        serve_many(apps) as transport,
        ControlClient(TOKEN, transport=transport) as client,
        httpx.AsyncClient(transport=transport) as http,
    ):
        cookies = {name: await seed_and_bump(http, name, f"r-{name}") for name in apps}

        own_config = Coordinator(refs, client, storage_config=coordinator_config(seaweed))
        refused = await own_config.checkpoint("ck-own", location, prepare_timeout_s=5)
        assert refused.status == "failed" and "writing checkpoint ck-own failed" in (refused.error or "")

        wrong = Coordinator(
            refs,
            client,
            storage_config=coordinator_config(seaweed),
            participant_storage=access(seaweed, secret="not-the-secret-key"),
        )
        denied = await wrong.checkpoint("ck-wrong", location, prepare_timeout_s=5)
        assert denied.status == "failed" and "ck-wrong failed" in (denied.error or "")
        assert "SignatureDoesNotMatch" in (denied.error or "") or "AccessDenied" in (denied.error or ""), denied.error

        right = Coordinator(
            refs, client, storage_config=coordinator_config(seaweed), participant_storage=access(seaweed)
        )
        done = await right.checkpoint("ck-right", location, prepare_timeout_s=5)
        assert done.status == "completed", done.error
        assert {p.participant_id: p.records for p in done.participants} == {"counter-a": 1, "counter-b": 1}

    fresh_apps, refs = counters()
    async with (
        serve_many(fresh_apps) as transport,
        ControlClient(TOKEN, transport=transport) as client,
        httpx.AsyncClient(transport=transport) as http,
    ):
        without = await Coordinator(refs, client, storage_config=coordinator_config(seaweed)).restore(
            "ck-right", location
        )
        assert without.status == "failed"  # the manifest is readable, the servers' own endpoint is not
        restored = await Coordinator(
            refs, client, storage_config=coordinator_config(seaweed), participant_storage=access(seaweed)
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
    assert seaweed.secret_key not in everything_logged and "not-the-secret-key" not in everything_logged


def test_storage_access_never_prints_its_keys() -> None:
    shown = StorageAccess(endpoint_url="http://s3", access_key_id="AKIA-visible?", secret_access_key="very-secret")
    assert "very-secret" not in repr(shown) and "very-secret" not in shown.model_dump_json()
    assert shown.wire() == {
        "endpoint_url": "http://s3",
        "access_key_id": "AKIA-visible?",
        "secret_access_key": "very-secret",
    }


class SecretsOnly:
    """The one Kube call ``storage_access`` makes, answering from a dict."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        return self.secrets[f"{namespace}/{name}"]


async def test_operator_sends_servers_what_the_location_names() -> None:
    """A Checkpoint names one of the admin's storage locations; the operator reaches it with the location's
    endpoint, region and Secret, and sends the servers exactly what the location names (nothing for ``default``)."""
    pytest.importorskip("kopf")
    from gym_operator.controllers.context import storage_access
    from gym_operator.specs import OperatorSettings, StorageLocation

    operator = OperatorSettings.from_env(
        {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": "r", "AWS_ENDPOINT_URL": "http://operator-default:8333"}
    )
    kube = SecretsOnly(
        {"ns/creds": {"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk"}, "ns/half": {"AWS_ACCESS_KEY_ID": "ak"}}
    )

    async def access(**fields):
        return await storage_access(StorageLocation(name="x", url="s3://b", **fields), "ns", kube, operator)

    config, sent = await access()
    assert sent is None and config.endpoint_url == "http://operator-default:8333"  # servers keep their own settings

    config, sent = await access(endpoint="http://other:9000", existing_secret="creds")
    assert config.endpoint_url == "http://other:9000" and config.access_key_id.get_secret_value() == "ak"
    assert sent is not None and sent.wire() == {
        "endpoint_url": "http://other:9000",
        "access_key_id": "ak",
        "secret_access_key": "sk",
    }

    config, sent = await access(region="eu-west-1")
    assert (
        sent is not None
        and sent.wire() == {"region": "eu-west-1"}
        and config.endpoint_url == "http://operator-default:8333"
    )

    with pytest.raises(LookupError, match="AWS_SECRET_ACCESS_KEY"):
        await access(existing_secret="half")


@pytest.mark.parametrize(
    "storage",
    [
        {"endpoint_url": "not a url"},
        {"endpoint_url": "ftp://127.0.0.1:21"},
        {"region": "Not A Region"},
        {"access_key_id": ""},
        {"access_key_id": 5},
        {"bucket": "extra fields are refused"},
        "s3://a-string-instead",
    ],
)
async def test_malformed_storage_access_is_400_and_changes_nothing(storage, tmp_path) -> None:
    from tests.support.asgi import Control, serve

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
