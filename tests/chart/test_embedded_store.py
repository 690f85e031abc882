"""The in-cluster object store, run here: the exact `weed` command line and forwarder the chart renders, with
the keys of the rendered Secret. Only pod-local values change: the data folder, and the port numbers (each
rendered port is mapped to a free one, because this machine is shared). Then:

- every socket SeaweedFS listens on is on 127.0.0.1: master, volume, filer, the S3 gateway and all their
  gRPC ports (the S3 gateway's gRPC port accepts a new identity configuration without any credentials);
- from this machine's non-loopback address, only the forwarder's S3 port answers;
- the S3 API refuses unsigned and wrongly signed requests, and serves the rendered keys.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from tests.chart.test_render import by_kind, env_of
from tests.support.sockets import is_loopback, listening, non_loopback_ipv4, refused

from gym_services.stack.objectstore import pick_ports, weed_binary

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

BIN = Path(sys.executable).parent


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=15)


@pytest.fixture
def store(render: Any, tmp_path: Path):
    # keys given as values: the chart renders them into its S3 Secret (generated ones come from the secrets hook)
    docs = render({"storage": {"s3": {"accessKeyId": "AKIAEMBEDDEDSTORE001", "secretAccessKey": "s" * 40}}})
    sts = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-s3"]
    weed, forwarder = sts["spec"]["template"]["spec"]["containers"]
    secret = by_kind(docs, "Secret")["demo-gym-checkpoint-s3"]["data"]
    keys = {name: base64.b64decode(value).decode() for name, value in secret.items()}
    env = env_of(weed)
    assert {name: env[name]["valueFrom"]["secretKeyRef"]["key"] for name in keys} == {k: k for k in keys}

    # pod-local values only: the volume's mount point and the port numbers
    free = pick_ports()
    public = pick_ports()["s3"]
    ports = {"9333": free["master"], "8080": free["volume"], "8888": free["filer"], "8334": free["s3"], "8333": public}
    assert {a.split("=")[1] for a in weed["args"] if re.match(r"^-(master|volume|filer|s3)\.port=", a)} == {
        "9333",
        "8080",
        "8888",
        "8334",
    }

    def local(arg: str) -> str:
        arg = arg.replace("-dir=/data", f"-dir={tmp_path / 'data'}")
        return re.sub(r"(?<=[=:])(9333|8080|8888|8334|8333)$", lambda m: str(ports[m.group(1)]), arg)

    weed_cmd = [weed_binary() if part == "weed" else part for part in weed["command"]] + [
        local(a) for a in weed["args"]
    ]
    forward_cmd = [str(BIN / forwarder["command"][0]), *(local(a) for a in forwarder["command"][1:])]
    (tmp_path / "data").mkdir()
    with open(tmp_path / "weed.log", "wb") as log:  # the child keeps its own descriptor
        procs = [
            subprocess.Popen(weed_cmd, env={**os.environ, **keys}, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path),
            subprocess.Popen(
                forward_cmd, env={**os.environ, **keys}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ),
        ]
    assert {name: item["valueFrom"]["secretKeyRef"]["key"] for name, item in env_of(forwarder).items()} == {
        k: k for k in keys
    }
    try:
        endpoint = f"http://127.0.0.1:{public}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), (tmp_path / "weed.log").read_text()[-2000:]
            try:
                if httpx.get(f"{endpoint}/healthz", timeout=1).status_code == 200:  # the rendered readiness probe
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        else:
            pytest.fail("the store did not become ready")
        yield {
            "endpoint": endpoint,
            "keys": keys,
            "weed": procs[0],
            "forwarder": procs[1],
            "ports": ports,
            "bucket": "gym-checkpoints",
        }
    finally:
        for proc in procs:
            _stop(proc)
        log.close()


def client(endpoint: str, **kwargs: Any):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, **kwargs.pop("config", {})),
        **kwargs,
    )


def test_the_rendered_store_refuses_unauthenticated_access(store: dict[str, Any]) -> None:
    keys, endpoint, bucket = store["keys"], store["endpoint"], store["bucket"]
    signed = client(
        endpoint, aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"]
    )
    # ready means the bucket is there: a coordinator's first read finds an empty bucket, not NoSuchBucket
    assert signed.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    signed.put_object(Bucket=bucket, Key="demo/checkpoints/ck1/manifest.json", Body=b'{"secret": "records"}')
    assert (
        signed.get_object(Bucket=bucket, Key="demo/checkpoints/ck1/manifest.json")["Body"].read()
        == b'{"secret": "records"}'
    )

    anonymous = client(endpoint, config={"signature_version": UNSIGNED})
    for call in (
        lambda: anonymous.get_object(Bucket=bucket, Key="demo/checkpoints/ck1/manifest.json"),
        lambda: anonymous.list_objects_v2(Bucket=bucket),
        lambda: anonymous.put_object(Bucket=bucket, Key="evil", Body=b"x"),
        lambda: anonymous.list_buckets(),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
    plain = httpx.get(f"{endpoint}/{bucket}/demo/checkpoints/ck1/manifest.json")
    assert plain.status_code == 403 and b"records" not in plain.content
    wrong = client(
        endpoint, aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key="not-the-key-0000000000"
    )
    with pytest.raises(ClientError) as denied:
        wrong.get_object(Bucket=bucket, Key="demo/checkpoints/ck1/manifest.json")
    assert denied.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_only_the_s3_port_is_reachable_from_outside_loopback(store: dict[str, Any]) -> None:
    weed_sockets = listening(store["weed"].pid)
    # master, volume, filer, the S3 gateway: each an HTTP and a gRPC port (and nothing else)
    ports = {port for _, port in weed_sockets}
    internal = {store["ports"][p] for p in ("9333", "8080", "8888", "8334")}
    assert internal | {p + 10000 for p in internal} <= ports
    assert all(is_loopback(address) for address, _ in weed_sockets), weed_sockets
    assert [port for _, port in listening(store["forwarder"].pid)] == [store["ports"]["8333"]]

    outside = non_loopback_ipv4()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try from")
    for port in sorted(ports):
        assert refused(outside, port), f"SeaweedFS port {port} answers on {outside}"
    # the forwarder is what answers there, and what it forwards to refuses anonymous reads
    assert httpx.get(f"http://{outside}:{store['ports']['8333']}/{store['bucket']}/x").status_code == 403
    # the filer would serve object bodies without a key: loopback-only is what keeps it out of reach
    assert httpx.get(f"http://127.0.0.1:{store['ports']['8888']}/", timeout=5).status_code in (200, 404)
