"""A dying inference worker costs no generation: the policy model keeps what the worker streamed as a
prefix and continues it on the restarted worker (real uvicorn processes, SIGKILL)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.services.models.policy_model.conftest import TOKENS_PER_SECOND
from tests.services.models.policy_model.model_support import (
    REQUESTS,
    generation_of,
    ident,
    model_app,
    reference,
    tokens_received,
    wait_until,
    worker_tokens,
)
from tests.services.models.procs import ServerProcess, start_server
from tests.support.asgi import Control, serve

WORKER_CONFIG = {"tokens_per_second": TOKENS_PER_SECOND, "time_to_first_token_s": 0.05}
RETRY = {"deadline_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.3}


class Restartable:
    """One worker on a fixed port: killed with SIGKILL and started again like a restarted pod."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: ServerProcess = start_server("inference_worker", WORKER_CONFIG, workdir / "run-0")
        self.port = int(self.proc.url.rsplit(":", 1)[1])
        self.url = self.proc.url
        self.starts = 1

    def kill(self) -> None:
        self.proc.kill()

    def restart(self) -> None:
        self.proc = start_server("inference_worker", WORKER_CONFIG, self.workdir / f"run-{self.starts}", port=self.port)
        self.starts += 1

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Restartable]:
    worker = Restartable(tmp_path)
    try:
        yield worker
    finally:
        worker.stop()


async def test_worker_killed_mid_generation_is_continued_on_the_restarted_worker(restartable, fast_worker) -> None:
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    async with serve(model_app(restartable.url, upstream_retry=RETRY)) as client:
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-crash")))
        gen = await tokens_received(client, "r-crash", 6)
        restartable.kill()
        await wait_until(lambda: gen.waiting_for_upstream, what="the generation to wait for its upstream")
        kept = gen.completion_tokens
        assert 6 <= kept < total and gen.state == "cut"
        await asyncio.sleep(0.6)  # down a while: every retry meanwhile is refused
        assert not call.done()
        restartable.restart()
        response = await asyncio.wait_for(call, 60)
        assert response.status_code == 200 and response.json() == expected
        live = (await Control(client).status())["live"]
    # every token was generated once: what the dead worker streamed is the prefix, the new one wrote the rest
    assert await worker_tokens(restartable.url) == total - kept
    assert live["tokens_generated"] == total and live["tokens_reused"] == kept
    assert live["upstream_failures"] >= 2 and live["waiting_for_upstream"] == 0


async def test_worker_killed_during_a_checkpoint_is_continued_after_resume(restartable, fast_worker, tmp_path) -> None:
    body = REQUESTS["lean"]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    async with serve(model_app(restartable.url, upstream_retry=RETRY)) as client:
        control = Control(client)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-ckpt")))
        await tokens_received(client, "r-ckpt", 5)
        assert (await control.prepare("ck-crash"))["status"] == "prepared"
        restartable.kill()  # while the checkpoint is open
        committed = await control.capture_persist("ck-crash", f"file://{tmp_path / 'store'}", episodes=["r-ckpt"])
        assert committed["records"] == 3  # the cut generation's prompt record, a chunk and its head
        gen = generation_of(client, "r-ckpt")
        assert gen is not None
        kept = gen.completion_tokens
        await control.resume("ck-crash")  # the continuation meets a dead worker: it waits, keeping the prefix
        await wait_until(lambda: gen.waiting_for_upstream, what="the generation to wait for its upstream")
        restartable.restart()
        response = await asyncio.wait_for(call, 60)
        assert response.status_code == 200 and response.json() == expected
    assert await worker_tokens(restartable.url) == total - kept
