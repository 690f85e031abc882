"""Every server refuses a request body over ``max_body_bytes`` with a 413 before reading it (``base/http.py``).

Real ``gymckpt serve`` processes on 127.0.0.1, spoken to over raw sockets so the test controls what is sent: a
300 MB body is announced and never sent, and the answer must come anyway.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.services.models.procs import ServerProcess, running
from tests.support.asgi import TOKEN, base_config

pytestmark = pytest.mark.e2e
LIMIT = 64 * 1024
HUGE = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running("counter", base_config("counter", max_body_bytes=LIMIT), tmp_path_factory.mktemp("limit")) as proc:
        yield proc


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("collection-data")
    config = base_config("collection", max_body_bytes=LIMIT, data_dir=str(data), max_upload_mb=1)
    with running("collection", config, tmp_path_factory.mktemp("collection")) as proc:
        yield proc


def exchange(url: str, head: str, body: bytes, timeout_s: float = 20.0) -> tuple[int, dict]:
    """Send ``head`` and ``body`` on a fresh connection (sending stops quietly if the server closes it) and
    read the answer: status and JSON body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head.encode())
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, rest = answer.split(b"\r\n", 1)
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1] or b"{}")


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return int(value)
    return 0


def post_head(path: str, length: int | None, extra: str = "") -> str:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{size}{extra}\r\n"


def test_a_300_mb_body_is_refused_before_it_is_read(counter: ServerProcess) -> None:
    # only 1 KB of the announced 300 MB is ever sent: the answer can only come if the server did not wait for it
    status, body = exchange(counter.url, post_head("/seed_session", HUGE), b"{" + b" " * 1023)
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    assert str(HUGE) in body["error"]["message"] and str(LIMIT) in body["error"]["message"]


def test_a_chunked_body_is_refused_at_the_first_chunk_past_the_limit(counter: ServerProcess) -> None:
    chunk = b" " * 16384
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(LIMIT // len(chunk) + 2))  # never terminated
    status, answer = exchange(counter.url, post_head("/seed_session", None), body)
    assert status == 413 and answer["error"]["code"] == "payload_too_large"


def test_the_control_routes_have_the_limit_too(counter: ServerProcess) -> None:
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    status, answer = exchange(counter.url, post_head("/ng-control/v1/checkpoint/prepare", HUGE, auth), b"{")
    assert status == 413 and answer["error"]["code"] == "payload_too_large"


def test_bodies_under_the_limit_are_served_and_nothing_changed(counter: ServerProcess) -> None:
    with httpx.Client(base_url=counter.url, timeout=10) as http:
        rollout = {"x-ng-rollout-id": "limit-0"}
        padded = (json.dumps({"start": 3}) + " " * (LIMIT - 100)).encode()  # just under the limit
        seeded = http.post("/seed_session", content=padded, headers={**rollout, "content-type": "application/json"})
        assert seeded.status_code == 200, seeded.text
        assert http.post("/increment", json={}, headers=rollout).json()["output"] == 4
        status = http.get("/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {TOKEN}"}).json()
        assert status["admission_open"]


def test_task_uploads_stream_under_their_own_limit(collection: ServerProcess, tmp_path: Path) -> None:
    """PUT /tasks streams to disk: max_body_bytes does not apply, max_upload_mb does, and an announced size over
    it is refused before a byte is read."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    row = json.dumps({"responses_create_params": {"input": "x" * 1000}}) + "\n"
    rows = (row * ((LIMIT * 2) // len(row))).encode()  # over max_body_bytes, under 1 MB
    with httpx.Client(base_url=collection.url, timeout=30) as http:
        answer = http.put("/tasks/big.jsonl", content=rows, headers=auth)
        assert answer.status_code == 200, answer.text
        assert answer.json()["bytes"] == len(rows)
    head = (
        "PUT /tasks/huge.jsonl HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {HUGE}\r\n\r\n"
    )
    status, body = exchange(collection.url, head, row.encode())
    assert status == 413 and body["error"]["code"] == "payload_too_large"
