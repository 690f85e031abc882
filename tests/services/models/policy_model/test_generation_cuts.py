"""Generation cuts, held responses and prefix restore, against the worker as a real uvicorn process."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from tests.services.models.policy_model.model_support import (
    REQUESTS,
    generation_of,
    generations,
    ident,
    model_app,
    reference,
    tokens_received,
    wait_until,
    worker_tokens,
)
from tests.support.asgi import Control, serve

from gym_services.models import tool_markup


@pytest.mark.parametrize("name", ["workplace", "lean"])
async def test_capture_takes_a_running_generation_as_far_as_it_streamed_and_never_stops_it(
    worker, fast_worker, name, tmp_path
) -> None:
    """A checkpoint the model resumes from: the stream goes on through prepare, capture and resume, the call returns
    what an uninterrupted one does with every token generated once and none continued; the checkpoint holds the
    generation as far as it had streamed at the capture, which a fresh model continues to the same response."""
    body = REQUESTS[name]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    location = f"file://{tmp_path}"
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-mark")))
        await tokens_received(client, "r-mark", 6)
        assert (await control.prepare("ck-mark"))["status"] == "prepared"
        at_prepare = generation_of(client, "r-mark").completion_tokens
        await tokens_received(client, "r-mark", at_prepare + 2)
        captured = await control.capture("ck-mark", location, episodes=["r-mark"])
        assert captured["records"] == 3  # its prompt record, a chunk and its head, written after resume
        # captured, and still streaming: the worker goes on generating for the call while the checkpoint is open
        at_capture = generation_of(client, "r-mark").completion_tokens
        gen = await tokens_received(client, "r-mark", min(at_capture + 2, total))
        assert gen.state in ("running", "held")
        live = (await control.status())["live"]
        assert live["cut"] == 0 and live["generations_cut"] == 0
        received_by_capture = live["tokens_generated_at_capture"]  # every token received by then: its one call's

        parked = await client.post("/v1/responses", json=body, headers=ident("r-other"))
        assert parked.status_code == 409 and parked.json()["error"]["code"] == "checkpoint_parked"

        await control.resume("ck-mark")
        committed = await control.persist("ck-mark")  # encoded from the capture while the stream went on
        response = await asyncio.wait_for(call, 30)
        assert response.status_code == 200 and response.json() == expected
        assert await worker_tokens(worker.url) - before == total  # every token generated once
        live = (await control.status())["live"]
        assert live["tokens_reused"] == 0 and live["tokens_generated"] == total  # nothing had to be continued
        assert live["cut"] == live["held"] == live["generations"] == 0

    # the checkpoint holds the generation as far as it had streamed at the capture: a fresh model continues it
    async with serve(model_app(worker.url), base_url="http://fresh") as client:
        control = Control(client)
        await control.restore("ck-mark", location, committed["manifest_key"], committed["manifest_sha256"])
        await control.resume("ck-mark")
        before = await worker_tokens(worker.url)
        response = await client.post("/v1/responses", json=body, headers=ident("r-mark", 1))
        assert response.status_code == 200 and response.json() == expected
        marked = (await control.status())["live"]["tokens_reused"]
        assert marked == received_by_capture and at_prepare + 2 <= marked <= at_capture < total
        assert await worker_tokens(worker.url) - before == total - marked  # only the tokens after the capture


@pytest.mark.parametrize("name", ["workplace", "lean"])
async def test_final_capture_cuts_in_flight_generation_and_an_abort_continues_it(
    worker, fast_worker, name, tmp_path
) -> None:
    """A final checkpoint (the process exits after it) cuts the running streams at its capture, so its prefixes hold
    every token generated; when it fails (abort), the server serves on and the cut call returns the uninterrupted
    response, every token generated once."""
    body = REQUESTS[name]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-cut")))
        await tokens_received(client, "r-cut", 6)
        prepared = await control.prepare("ck-cut", final=True)
        assert prepared["status"] == "prepared" and prepared["final"] is True
        # prepared, the model starts no stream but its running ones go on generating until the capture cuts them
        at_prepare = generation_of(client, "r-cut").completion_tokens
        await tokens_received(client, "r-cut", at_prepare + 2)
        assert generation_of(client, "r-cut").state == "running"
        await control.capture("ck-cut", f"file://{tmp_path}", final=True)
        gen = generation_of(client, "r-cut")
        assert gen is not None and gen.state == "cut"
        cut_at = gen.completion_tokens
        assert 6 <= cut_at < total and expected["output"][0]["content"][0]["text"].startswith(gen.text[:10])
        live = (await control.status())["live"]
        assert live["cut"] == 1 and live["generations"] == 0 and live["generations_cut"] == 1

        parked = await client.post("/v1/responses", json=body, headers=ident("r-other"))
        assert parked.status_code == 409 and parked.json()["error"]["code"] == "checkpoint_parked"
        await asyncio.sleep(0.3)  # paused: the worker generates nothing for us meanwhile
        assert await worker_tokens(worker.url) - before == cut_at
        assert not call.done()

        await control.abort("ck-cut")
        response = await asyncio.wait_for(call, 30)
        assert response.status_code == 200 and response.json() == expected
        assert await worker_tokens(worker.url) - before == total  # every token generated once
        live = (await control.status())["live"]
        assert live["tokens_reused"] == cut_at and live["tokens_generated"] == total
        assert live["cut"] == live["held"] == live["generations"] == 0
        metrics = (await client.get("/metrics")).text
        assert f'gym_model_tokens_reused_total{{source="cut"}} {float(cut_at)}' in metrics
        assert f"gym_model_tokens_generated_total {float(total)}" in metrics


async def test_cut_keeps_every_token_the_worker_sent_while_the_reader_was_behind(worker, fast_worker, tmp_path) -> None:
    """The model's event loop is busy while the worker keeps streaming: tokens pile up unread in the
    connection. A final checkpoint's cut must keep all of them (the worker counted them): none is generated again."""
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-behind")))
        await tokens_received(client, "r-behind", 3)
        time.sleep(0.4)  # blocks this event loop: ~12 tokens arrive meanwhile, unread
        assert (await control.prepare("ck-behind", final=True))["status"] == "prepared"
        time.sleep(0.4)  # and again between prepare and the capture's cut
        await control.capture("ck-behind", f"file://{tmp_path}", final=True)
        gen = generation_of(client, "r-behind")
        assert gen is not None and gen.state == "cut"
        generated = await worker_tokens(worker.url) - before
        assert gen.completion_tokens == generated, (
            f"the worker generated {generated} tokens, the prefix holds {gen.completion_tokens}"
        )
        assert 3 + 6 <= gen.completion_tokens < total
        await control.abort("ck-behind")
        assert (await asyncio.wait_for(call, 30)).json() == expected
    assert await worker_tokens(worker.url) - before == total  # every token generated once


async def test_cut_inside_a_tool_call(worker, fast_worker, tmp_path) -> None:
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url)) as client:
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-tool")))

        def inside_markup() -> bool:
            g = generation_of(client, "r-tool")
            return g is not None and tool_markup.OPEN in g.text and '"arguments"' in g.text

        await wait_until(inside_markup, what="a cut point inside the tool call")
        await Control(client).prepare("ck-tool", final=True)
        await Control(client).capture("ck-tool", f"file://{tmp_path}", final=True)
        gen = generation_of(client, "r-tool")
        assert gen is not None and gen.state == "cut"
        assert tool_markup.CLOSE not in gen.text and tool_markup.parse(gen.text).tool_calls == []
        await Control(client).abort("ck-tool")
        response = (await asyncio.wait_for(call, 30)).json()
    assert response == expected and response["output"][-1]["type"] == "function_call"
    assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]


@pytest.mark.parametrize("final", [False, True])
async def test_several_generations_captured_together(worker, fast_worker, final, tmp_path) -> None:
    """Every running generation is captured: a checkpoint the model resumes from leaves them all streaming, a final
    one cuts them all (and its abort continues them)."""
    expected = {name: await reference(fast_worker.url, body) for name, body in REQUESTS.items()}
    total = sum(r["usage"]["output_tokens"] for r in expected.values())
    async with serve(model_app(worker.url)) as client:
        before = await worker_tokens(worker.url)
        calls = {
            name: asyncio.create_task(client.post("/v1/responses", json=body, headers=ident(f"r-{name}")))
            for name, body in REQUESTS.items()
        }
        for name in REQUESTS:
            await tokens_received(client, f"r-{name}", 3)
        control = Control(client)
        assert (await control.prepare("ck-many", final=final or None))["status"] == "prepared"
        await control.capture("ck-many", f"file://{tmp_path}", final=final or None)
        live = (await control.status())["live"]
        if final:
            assert live["cut"] == len(REQUESTS)
            await control.abort("ck-many")
        else:
            assert live["cut"] == 0 and live["generations"] + live["held"] == len(REQUESTS)
            await control.resume("ck-many")
        for name, call in calls.items():
            assert (await asyncio.wait_for(call, 30)).json() == expected[name], name
    assert await worker_tokens(worker.url) - before == total


async def test_response_finishing_during_checkpoint_is_held_until_resume(worker, fast_worker, tmp_path) -> None:
    body = REQUESTS["blackjack"]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-held")))
        # all but the last few tokens are in (about 0.1 s of generation left at the worker's pace): the generation
        # finishes while the checkpoint is open (prepare does not stop a running stream), and its response is held
        await tokens_received(client, "r-held", total - 3)
        assert (await control.prepare("ck-held"))["status"] == "prepared"
        await wait_until(lambda: generation_of(client, "r-held").state == "held", what="the response held")
        live = (await control.status())["live"]
        assert live["held"] == 1 and live["cut"] == 0 and live["responses_held"] == 1
        await asyncio.sleep(0.3)
        assert not call.done()  # held, not delivered
        committed = await control.capture_persist("ck-held", f"file://{tmp_path}", episodes=["r-held"])
        assert committed["records"] == 3 and committed["episodes"] == ["r-held"]  # its prompt, a chunk, its head
        await control.resume("ck-held")
        assert (await asyncio.wait_for(call, 10)).json() == expected
    assert await worker_tokens(worker.url) - before == total

    # the held response was written whole: a restored model answers its re-issue without generating
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        await control.restore("ck-held", f"file://{tmp_path}", committed["manifest_key"], committed["manifest_sha256"])
        await control.resume("ck-held")
        again = await worker_tokens(worker.url)
        response = await client.post("/v1/responses", json=body, headers=ident("r-held", 1))
        assert response.json() == expected
        assert await worker_tokens(worker.url) == again
        assert (await control.status())["live"]["tokens_reused"] == total


async def test_abort_continues_like_resume(worker, fast_worker) -> None:
    body = REQUESTS["lean"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url)) as client:
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-abort")))
        await tokens_received(client, "r-abort", 4)
        await Control(client).prepare("ck-abort")
        await Control(client).abort("ck-abort")
        assert (await asyncio.wait_for(call, 30)).json() == expected
    assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]


async def test_lease_expiry_resumes_cut_calls(worker, fast_worker) -> None:
    body = REQUESTS["ipi"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url)) as client:
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-lease")))
        await tokens_received(client, "r-lease", 3)
        await Control(client).prepare("ck-lease", lease_s=0.3)
        assert (await asyncio.wait_for(call, 30)).json() == expected  # no resume: the lease ran out
        assert (await Control(client).status())["phase"] == "open"


async def test_cut_that_waits_too_long_closes_the_stream_where_it_is(worker, fast_worker, caplog, tmp_path) -> None:
    """An upstream that does not end the stream within ``cut_wait_s`` of being told to stop by a final checkpoint
    (here: the worker process is frozen) gets its stream closed where it is: still the exact text, and what is
    generated again is exactly what was in flight when it was closed."""
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url, cut_wait_s=0.2)) as client:
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-force")))
        await tokens_received(client, "r-force", 5)
        os.kill(worker.process.pid, signal.SIGSTOP)
        try:
            assert (await Control(client).prepare("ck-force", final=True))["status"] == "prepared"
            await Control(client).capture("ck-force", f"file://{tmp_path}", final=True)
        finally:
            os.kill(worker.process.pid, signal.SIGCONT)
        gen = generation_of(client, "r-force")
        assert gen is not None and gen.state == "cut"
        assert any("cut waited too long" in r.getMessage() for r in caplog.records)
        await asyncio.sleep(0.3)  # the worker has seen the closed connection
        in_flight = await worker_tokens(worker.url) - before - gen.completion_tokens
        await Control(client).abort("ck-force")
        assert (await asyncio.wait_for(call, 30)).json() == expected
    assert in_flight >= 0
    assert await worker_tokens(worker.url) - before - expected["usage"]["output_tokens"] == in_flight


async def test_calls_without_identity_are_not_checkpointed(worker, fast_worker, tmp_path) -> None:
    body = REQUESTS["lean"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        call = asyncio.create_task(client.post("/v1/responses", json=body))
        await wait_until(lambda: any(g.completion_tokens >= 3 for g in generations(client)), what="tokens")
        assert (await control.prepare("ck-anon"))["status"] == "prepared"
        committed = await control.capture_persist("ck-anon", f"file://{tmp_path}")
        assert (await control.status())["live"]["cut"] == 0  # still streaming
        assert committed["records"] == 0
        await control.resume("ck-anon")
        assert (await asyncio.wait_for(call, 30)).json() == expected


async def test_cut_and_resume_without_continuous_usage(worker, fast_worker, tmp_path) -> None:
    """An upstream without per-chunk usage (plain vLLM streaming): tokens are counted from the chunks."""
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url, upstream={"continuous_usage": False})) as client:
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-plain")))
        await tokens_received(client, "r-plain", 7)
        await Control(client).prepare("ck-plain", final=True)
        await Control(client).capture("ck-plain", f"file://{tmp_path}", final=True)
        assert generation_of(client, "r-plain").completion_tokens == await worker_tokens(worker.url) - before
        await Control(client).abort("ck-plain")
        assert (await asyncio.wait_for(call, 30)).json() == expected
    assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]
