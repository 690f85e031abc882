"""The worker as a real uvicorn process: a token is counted only if it reached a client that kept reading.

A client that half-closes its connection (what the policy model does to cut a generation) and keeps
reading must receive every token the worker counted: the worker stops at the end of the request
stream and never counts a token it wrote after uvicorn closed the connection.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.services.models.inference_worker.worker_client import first_turn_cases
from tests.services.models.procs import ServerProcess, running

#: Fast enough that the worker emits a token on almost every event-loop step: the moment its
#: client leaves is then always close to a token's turn.
TOKENS_PER_SECOND = 2000


@pytest.fixture(scope="module")
def busy_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = {"tokens_per_second": TOKENS_PER_SECOND, "time_to_first_token_s": 0.0}
    with running("inference_worker", config, tmp_path_factory.mktemp("busy-worker")) as proc:
        yield proc


def _tokens(url: str) -> int:
    return httpx.get(f"{url}/stats", timeout=10).json()["tokens_generated"]


def _stream_and_half_close(url: str, body: dict, after_bytes: int) -> tuple[int, bool]:
    """POST a streamed completion, half-close after ``after_bytes`` of response, read to EOF.

    Returns the content tokens received and whether the finish chunk arrived.
    """
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps({**body, "stream": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    received = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + payload)
        while len(received) < after_bytes:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    tokens = finished = 0
    for line in received.decode("utf-8", "replace").split("\n"):
        if not line.startswith("data: {"):
            continue
        try:
            chunk = json.loads(line[len("data: ") :])
        except json.JSONDecodeError:
            continue  # a line cut by the chunked framing: never a token line (each is written whole)
        for choice in chunk.get("choices") or []:
            if choice["delta"].get("content"):
                tokens += 1
            if choice.get("finish_reason"):
                finished = 1
    return tokens, bool(finished)


def test_every_counted_token_reaches_a_client_that_half_closed(busy_worker) -> None:
    policy, body = next((p, b) for p, b in first_turn_cases() if p == "lean-refine")
    body = {**body, "model": policy}
    cut = 0
    for round_no in range(40):
        before = _tokens(busy_worker.url)
        received, finished = _stream_and_half_close(busy_worker.url, body, after_bytes=600 + 97 * round_no)
        counted = _tokens(busy_worker.url) - before
        assert counted == received, f"round {round_no}: the worker counted {counted} tokens, the client got {received}"
        cut += not finished
    assert cut >= 10, f"only {cut} of 40 streams were stopped mid-generation; the test did not test cuts"
