"""Storage locations as resources, on the emulator with real kopf and SeaweedFS (its S3 auth on: a request without
the right signature fails for real):

- the servers checkpoint and restore with the location's keys held only by the operator: no server process has an
  AWS variable, the operator's own environment has wrong keys, the location's Secret has the right ones, and the
  operator's storage gateway signs each object (``docs/decisions.md``);
- the operator's metrics answer with the transaction's series;
- catalog sync: every Checkpoint resource deleted, the operator restarted, the stored checkpoint reappears as a
  Checkpoint and restores by name into fresh servers;
- a location's status: Available or Unavailable with the reason (and an Event); a Checkpoint naming a ReadOnly
  location is refused.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    RELEASE,
    Stack,
    apply,
    checkpoint_doc,
    get,
    reasons_of,
    restore_of,
    wait_for,
    wait_phase,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.k8s

GATEWAY_KEY = "release-gateway-key-0123456789abcdef"
#: what reaches S3: keys, a session, a profile, an endpoint
AWS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


def location_doc(name: str, s3_location: str, endpoint: str, **spec: Any) -> dict[str, Any]:
    bucket, prefix = s3_location[len("s3://") :].split("/", 1)
    return {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "CheckpointStorageLocation",
        "metadata": {
            "name": name,
            "labels": {"gym-checkpoint.dev/location": "default"} if name.endswith("default") else {},
        },
        "spec": {
            "release": RELEASE,
            "bucket": bucket,
            "prefix": prefix,
            "endpoint": endpoint,
            "region": "us-east-1",
            **spec,
        },
    }


def location_phase(kubectl: Any, name: str) -> str | None:
    return (get(kubectl, "checkpointstoragelocation", name).get("status") or {}).get("phase")


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_keys_only_in_the_operator_then_catalog_sync_restores_by_name(
    operator_env, kubectl, seaweed, tmp_path, monkeypatch
) -> None:
    start_operator, s3_location = operator_env
    kubectl(
        "create", "secret", "generic", "store-keys",
        f"--from-literal=AWS_ACCESS_KEY_ID={seaweed.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={seaweed.secret_key}",
    )  # fmt: skip
    default = f"{RELEASE}-default"
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(location_doc(default, s3_location, seaweed.endpoint, credential={"name": "store-keys"})),
    )
    for name in AWS:  # the servers get no key, no endpoint: only their gateway's URL
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    storage = {"gateway_url": f"http://127.0.0.1:{port}", "endpoint_url": "http://127.0.0.1:9", "region": "us-east-1"}
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"}, config={"storage": storage})
    stack.start()
    stack.create_pods()
    for server in stack.state.servers:
        assert not set(AWS) & set(environment_of(server.pid)), server.name
    wrong = {"AWS_ACCESS_KEY_ID": "not-the-key", "AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}
    env = {"GYMCKPT_GATEWAY_KEY": GATEWAY_KEY, **wrong}
    operator = start_operator(stack, gateway=port, **env)
    try:
        wait_for(lambda: location_phase(kubectl, default) == "Available", timeout=60, what="the location validated")
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 5}, headers={"x-ng-rollout-id": "r0"})
            http.post("/increment", json={"by": 2}, headers={"x-ng-rollout-id": "r0"})
            cookies = dict(http.cookies)
        apply(kubectl, checkpoint_doc("first", prepareTimeoutSeconds=10))
        wait_phase(kubectl, "checkpoint", "first", "Completed")
        status = get(kubectl, "checkpoint", "first")["status"]
        assert status["location"] == s3_location and status["participantCount"] == 1
        checkpoint_id = status["checkpointId"]

        exposed = metrics(operator.health)
        for series in (
            f'gym_operator_transactions_total{{kind="checkpoint",release="{RELEASE}",result="completed"}} 1.0',
            f'gym_operator_checkpoint_pause_seconds_count{{release="{RELEASE}"}} 1.0',
            f'gym_operator_checkpoint_published_seconds_count{{release="{RELEASE}"}} 1.0',
            f'gym_operator_leader{{release="{RELEASE}"}} 1.0',
            f'gym_operator_last_successful_checkpoint_age_seconds{{release="{RELEASE}"}}',
            f'gym_operator_last_successful_checkpoint_timestamp_seconds{{release="{RELEASE}"}}',
            f'gym_operator_transaction_bytes_total{{kind="checkpoint",release="{RELEASE}"}}',
        ):
            assert series in exposed, series

        kubectl("delete", "checkpoint", "--all", timeout=60)  # deletionPolicy Retain: the data stays
        os.killpg(operator.pid, signal.SIGTERM)
        assert operator.wait(timeout=60) == 0
        operator = start_operator(stack, gateway=port, log_name="operator-2.log", **env)
        wait_for(
            lambda: kubectl("get", "checkpoint", checkpoint_id, check=False).returncode == 0,
            timeout=60,
            what="the catalog sync to bring the stored checkpoint back as a Checkpoint",
        )
        wait_phase(kubectl, "checkpoint", checkpoint_id, "Completed")
        synced = get(kubectl, "checkpoint", checkpoint_id)
        assert synced["status"]["reason"] == "Synced" and synced["status"]["checkpointId"] == checkpoint_id
        assert synced["metadata"]["annotations"]["gym-checkpoint.dev/synced-from"] == default
        assert "CatalogSynced" in reasons_of(kubectl, default)
        assert f'gym_operator_last_successful_checkpoint_timestamp_seconds{{release="{RELEASE}"}}' in metrics(
            operator.health
        )  # the new leader's clock starts at the newest Completed Checkpoint

        stack.kill()
        stack.start()  # fresh processes: nothing of the rollout left
        apply(kubectl, restore_of("back", checkpoint_id))
        wait_phase(kubectl, "restore", "back", "Completed")
        with httpx.Client(base_url=stack.url("counter-0"), cookies=cookies) as http:
            bumped = http.post("/increment", json={"by": 3}, headers={"x-ng-rollout-id": "r0", "x-ng-attempt": "1"})
            assert bumped.json() == {"output": 10}
    finally:
        stack.kill()
    log = (tmp_path / "operator.log").read_text() + (tmp_path / "operator-2.log").read_text()
    assert seaweed.secret_key not in log


def test_a_location_is_validated_and_a_read_only_one_is_never_written(operator_env, kubectl, seaweed, tmp_path) -> None:
    start_operator, s3_location = operator_env
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            location_doc(
                "lost", s3_location, seaweed.endpoint, credential={"name": "missing"}, validationFrequency="5s"
            )
        ),
    )
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(location_doc("archive", s3_location, seaweed.endpoint, accessMode="ReadOnly")),
    )
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        wait_for(lambda: location_phase(kubectl, "lost") == "Unavailable", timeout=60, what="the lost location")
        lost = get(kubectl, "checkpointstoragelocation", "lost")["status"]
        assert lost["reason"] == "CredentialsNotFound" and "Secret missing does not exist" in lost["message"]
        assert "CredentialsNotFound" in reasons_of(kubectl, "lost")
        wait_for(lambda: location_phase(kubectl, "archive") == "Available", timeout=60, what="the archive")
        apply(kubectl, checkpoint_doc("to-archive", storageLocation="archive"))
        apply(kubectl, checkpoint_doc("to-lost", storageLocation="lost"))
        wait_phase(kubectl, "checkpoint", "to-archive", "Failed")
        wait_phase(kubectl, "checkpoint", "to-lost", "Failed")
        assert get(kubectl, "checkpoint", "to-archive")["status"]["reason"] == "StorageLocationReadOnly"
        assert get(kubectl, "checkpoint", "to-lost")["status"]["reason"] == "StorageLocationUnavailable"
        keys = seaweed.env()
        kubectl(
            "create", "secret", "generic", "missing",
            f"--from-literal=AWS_ACCESS_KEY_ID={keys['AWS_ACCESS_KEY_ID']}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={keys['AWS_SECRET_ACCESS_KEY']}",
        )  # fmt: skip
        wait_for(lambda: location_phase(kubectl, "lost") == "Available", timeout=60, what="the Secret to be found")
    finally:
        stack.kill()
