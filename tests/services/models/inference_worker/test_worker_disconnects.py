"""The worker as a real uvicorn process: a token is counted only if it reached a client that kept reading.

A client that half-closes its connection (what the policy model does to cut a generation) and keeps
reading must receive every token the worker counted: the worker stops at the end of the request
stream and never counts a token it wrote after uvicorn closed the connection.

The client counts what it received as the policy model does: by the token ids of the chunks
(``return_token_ids``), not by chunks with text. A token that ends inside a multi-byte character
carries no text (the one completing it carries the whole character) yet is generated and counted all
the same; the answer used here (a Lean theorem over the reals, with subscripted hypotheses) has four such
tokens, the first of them its 121st token.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from tests.services.models.inference_worker.worker_client import first_turn_cases
from tests.services.models.procs import ServerProcess, running

#: Fast enough that the worker emits a token on almost every event-loop step: the moment its
#: client leaves is then always close to a token's turn.
TOKENS_PER_SECOND = 2000
ROUNDS = 40


@pytest.fixture(scope="module")
def busy_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = {"tokens_per_second": TOKENS_PER_SECOND, "time_to_first_token_s": 0.0}
    with running("inference_worker", config, tmp_path_factory.mktemp("busy-worker")) as proc:
        yield proc


def _tokens(url: str) -> int:
    return httpx.get(f"{url}/stats", timeout=10).json()["tokens_generated"]


@dataclass
class Received:
    token_ids: int  # tokens received: what the worker must have counted
    with_text: int  # of them, those carrying text
    finished: bool  # the finish chunk arrived (the stream was not cut)
    ended: bool  # the worker ended the stream within the read deadline


def _stream_and_half_close(url: str, body: dict, after_bytes: int) -> Received:
    """POST a streamed completion, half-close after ``after_bytes`` of response, read to EOF (at most 60 s)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps({**body, "stream": True, "return_token_ids": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    received = b""
    ended = False
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + payload)
        while len(received) < after_bytes and not ended:
            chunk = sock.recv(65536)
            ended = not chunk
            received += chunk
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 60
        while not ended and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            ended = not chunk
            received += chunk
    token_ids = with_text = finished = 0
    for line in received.decode("utf-8", "replace").split("\n"):
        if not line.startswith("data: {"):
            continue
        try:
            chunk = json.loads(line[len("data: ") :])
        except json.JSONDecodeError:
            continue  # a line cut by the chunked framing: never a token line (each is written whole)
        for choice in chunk.get("choices") or []:
            ids = len(choice.get("token_ids") or [])
            token_ids += ids
            with_text += ids if choice["delta"].get("content") else 0
            if choice.get("finish_reason"):
                finished = 1
    return Received(token_ids, with_text, bool(finished), ended)


def test_every_counted_token_reaches_a_client_that_half_closed(busy_worker) -> None:
    policy, body = next((p, b) for p, b in first_turn_cases() if p == "lean-refine")
    body = {**body, "model": policy}
    cut = past_textless = 0
    for round_no in range(ROUNDS):
        before = _tokens(busy_worker.url)
        # cuts spread over the whole answer (about 200 tokens of about 210 bytes each), so some fall past the
        # tokens that carry no text whatever the machine's load (a loaded machine cuts later than asked)
        got = _stream_and_half_close(busy_worker.url, body, after_bytes=600 + 1000 * round_no)
        counted = _tokens(busy_worker.url) - before
        assert got.ended, f"round {round_no}: the worker did not end the half-closed stream within 60 s"
        assert counted == got.token_ids, (
            f"round {round_no}: the worker counted {counted} tokens, the client got {got.token_ids}"
        )
        cut += not got.finished
        past_textless += not got.finished and got.with_text < got.token_ids
    assert cut >= 10, f"only {cut} of {ROUNDS} streams were stopped mid-generation; the test did not test cuts"
    assert past_textless >= 1, "no stream was cut past a token without text; the test did not test those"
