"""Commit -> restore into a fresh model -> the re-issued call continues from the staged prefix."""

from __future__ import annotations

import asyncio
import json
from array import array

import pytest
from tests.services.models.policy_model.model_support import (
    REQUESTS,
    generation_of,
    ident,
    model_app,
    reference,
    tokens_received,
    worker_tokens,
)
from tests.support.asgi import Control, serve
from tests.support.records import records, rewrite_record

from gym_services.base.token_codec import read_varint, write_varint
from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord
from gym_services.models.policy_model.ledger.entries import EntryLog
from gym_services.models.policy_model.ledger.wire import LedgerEntry
from gym_services.models.policy_model.prefixes import (
    StagedPrefix,
    encode,
    freeze,
    is_chunk_record,
    is_prompt_record,
    prefix_record_key,
    read_records,
)


async def checkpoint_cut_generation(worker_url: str, body: dict, rollout: str, location: str, episodes=None):
    """Start a call, take a final checkpoint (its capture cuts the call), commit, then stop the model; returns
    (commit answer, prefix tokens)."""
    app = model_app(worker_url)
    async with serve(app) as client:
        control = Control(client)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident(rollout)))
        await tokens_received(client, rollout, 8)
        assert (await control.prepare("ck1", final=True))["status"] == "prepared"
        await control.capture("ck1", location, episodes=[rollout] if episodes is None else episodes, final=True)
        gen = generation_of(client, rollout)
        assert gen is not None and gen.state == "cut"
        cut_at = gen.completion_tokens
        committed = await control.persist("ck1")
    # the model shut down with the call still open: it gets an error answer, it does not hang
    old = await asyncio.wait_for(call, 10)
    assert old.status_code == 503 and old.json()["error"]["code"] == "not_ready"
    return committed, cut_at


async def test_restored_prefix_is_continued_not_regenerated(worker, fast_worker, storage_url) -> None:
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    total = expected["usage"]["output_tokens"]
    start = await worker_tokens(worker.url)
    committed, cut_at = await checkpoint_cut_generation(worker.url, body, "task3-0", storage_url)
    assert committed["records"] == 3 and committed["episodes"] == ["task3-0"]  # its prompt, a chunk, its head
    assert await worker_tokens(worker.url) - start == cut_at

    async with serve(model_app(worker.url), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore("ck1", storage_url, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["episodes"] == {"task3-0": 1} and restored["records"] == 3
        assert (await control.status())["live"]["staged_prefixes"] == 1
        parked = await client.post("/v1/responses", json=body, headers=ident("task3-0", 1))
        assert parked.status_code == 409 and parked.json()["error"]["code"] == "checkpoint_parked"
        await control.resume("ck1")

        stale = await client.post("/v1/responses", json=body, headers=ident("task3-0", 0))
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"

        before = await worker_tokens(worker.url)
        response = await client.post("/v1/responses", json=body, headers=ident("task3-0", 1))
        assert response.status_code == 200 and response.json() == expected
        assert await worker_tokens(worker.url) - before == total - cut_at  # only the tokens after the cut
        assert await worker_tokens(worker.url) - start == total  # over both processes: each token once
        live = (await control.status())["live"]
        assert live["staged_prefixes"] == 0 and live["tokens_reused"] == cut_at
        assert live["tokens_generated"] == total - cut_at

        # a prefix is used once: the same request again is generated from scratch
        before = await worker_tokens(worker.url)
        again = await client.post("/v1/responses", json=body, headers=ident("task3-0", 1))
        assert again.json() == expected
        assert await worker_tokens(worker.url) - before == total


async def test_prefix_of_another_request_is_not_used(worker, fast_worker, tmp_path) -> None:
    location = f"file://{tmp_path}"
    committed, _ = await checkpoint_cut_generation(worker.url, REQUESTS["lean"], "r-x", location)
    other = REQUESTS["blackjack"]
    expected = await reference(fast_worker.url, other)
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        await control.restore("ck1", location, committed["manifest_key"])
        await control.resume("ck1")
        before = await worker_tokens(worker.url)
        response = await client.post("/v1/responses", json=other, headers=ident("r-x", 1))
        assert response.json() == expected
        assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]
        assert (await control.status())["live"]["staged_prefixes"] == 1  # still waiting for its own request


async def test_scope_leaves_other_rollouts_out(worker, tmp_path) -> None:
    committed, _ = await checkpoint_cut_generation(
        worker.url, REQUESTS["lean"], "r-in", f"file://{tmp_path}", episodes=["r-other"]
    )
    assert committed["records"] == 0 and committed["episodes"] == []


async def test_retire_drops_restored_prefixes(worker, fast_worker, tmp_path) -> None:
    location = f"file://{tmp_path}"
    body = REQUESTS["lean"]
    expected = await reference(fast_worker.url, body)
    committed, _ = await checkpoint_cut_generation(worker.url, body, "r-ret", location)
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        await control.restore("ck1", location, committed["manifest_key"])
        await control.resume("ck1")
        assert (await control.retire("r-ret", 0))["retired"] is False  # the staged prefix belongs to attempt 1
        assert (await control.status())["live"]["staged_prefixes"] == 1
        assert (await control.retire("r-ret", 1))["retired"] is True
        assert (await control.status())["live"]["staged_prefixes"] == 0
        before = await worker_tokens(worker.url)
        response = await client.post("/v1/responses", json=body, headers=ident("r-ret", 2))
        assert response.json() == expected
        assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]
        late = await client.post("/v1/responses", json=body, headers=ident("r-ret", 1))
        assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"


async def test_retire_and_newer_attempts_end_open_calls_with_409(worker) -> None:
    body = REQUESTS["lean"]
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-live")))
        await tokens_received(client, "r-live", 3)
        retired = await asyncio.wait_for(control.retire("r-live", 0), 5)
        assert retired["retired"] is True
        ended = await asyncio.wait_for(call, 5)
        assert ended.status_code == 409 and ended.json()["error"]["code"] == "stale_attempt"
        stopped = await worker_tokens(worker.url)
        await asyncio.sleep(0.2)
        assert await worker_tokens(worker.url) == stopped  # the upstream stream was closed

        # a cut call whose rollout moves on to a newer attempt ends the same way
        old = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-next", 0)))
        await tokens_received(client, "r-next", 3)
        await control.prepare("ck-next")
        await control.resume("ck-next")
        newer = asyncio.create_task(
            client.post("/v1/responses", json=REQUESTS["blackjack"], headers=ident("r-next", 1))
        )
        ended = await asyncio.wait_for(old, 5)
        assert ended.status_code == 409 and ended.json()["error"]["code"] == "stale_attempt"
        assert (await asyncio.wait_for(newer, 30)).status_code == 200
        assert (await control.status())["live"]["cut"] == 0


async def test_invalid_records_are_refused_and_nothing_is_staged(worker, tmp_path) -> None:
    location = f"file://{tmp_path}"
    committed, _ = await checkpoint_cut_generation(worker.url, REQUESTS["lean"], "r-bad", location)

    def other_digest(blob: bytes) -> bytes:
        size, start = read_varint(blob, 1)
        head = json.loads(blob[start : start + size])
        head["digest"] = "0" * 64  # no longer the prefix its key names
        changed = json.dumps(head).encode()
        out = bytearray(blob[:1])
        write_varint(len(changed), out)
        return bytes(out) + changed + blob[start + size :]

    key = next(
        k for k in records(location, committed["manifest_key"]) if not is_prompt_record(k) and not is_chunk_record(k)
    )
    rewrite_record(location, committed["manifest_key"], key, other_digest)
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        refused = await control.restore("ck1", location, committed["manifest_key"], expect=422)
        assert refused["error"]["code"] == "invalid_state" and "key names" in refused["error"]["message"]
        status = await control.status()
        assert status["phase"] == "fresh" and status["live"]["staged_prefixes"] == 0


def no_ledger(rollout_id: str, index: int) -> array:
    raise KeyError(rollout_id)


def _record(payload: dict, key: str | None = None, rollout: str = "r", attempt: int = 0) -> RestoredRecord:
    key = key or prefix_record_key(payload.get("rollout_id", "r"), payload.get("digest", "0" * 64))
    return RestoredRecord(key, json.dumps(payload).encode(), rollout, attempt)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (
            {
                "schema_version": 3,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
            },
            "schema_version",
        ),
        (
            {
                "schema_version": 1,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": True,
                "completion_tokens": 1,
            },
            "finish_reason",
        ),
        (
            {
                "schema_version": 1,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": -1,
            },
            "completion_tokens",
        ),
        (
            {
                "schema_version": 1,
                "rollout_id": "r",
                "attempt": 3,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
            },
            "manifest identity",
        ),
        (
            {
                "schema_version": 2,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
            },
            "needs token_ids",
        ),
        (
            {
                "schema_version": 2,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
                "prompt_token_ids": [1],
                "token_ids": [20],
                "log_probs": [],
            },
            "1 token_ids but 0 log_probs",
        ),
        (
            {
                "schema_version": 2,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 2,
                "prompt_token_ids": [1],
                "token_ids": [20],
                "log_probs": [-1.0],
            },
            "completion_tokens 2",
        ),
        (
            {
                "schema_version": 2,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
                "token_ids": [20],
                "log_probs": [-1.0],
            },
            "prompt's token ids",
        ),
        (
            {
                "schema_version": 1,
                "rollout_id": "r",
                "attempt": 0,
                "digest": "a" * 64,
                "text": "x",
                "complete": False,
                "completion_tokens": 1,
                "token_ids": [20],
            },
            "schema 1 record holds no token ids",
        ),
    ],
)
async def test_prefix_record_validation(worker, payload: dict, problem: str) -> None:
    """The JSON records (schema 1 and 2) are read as before."""
    manager = model_app(worker.url).state.generations
    with pytest.raises(InvalidState, match=problem):
        manager.validate([_record(payload)], no_ledger)
    with pytest.raises(InvalidState, match="not JSON"):
        manager.validate([RestoredRecord("prefix-x", b"{", "r", 0)], no_ledger)
    assert manager.staged == {}


async def test_delivered_reply_in_transit_is_committed_and_answered_after_restore(
    worker, fast_worker, tmp_path
) -> None:
    """A response delivered just before prepare may not have reached the agent, whose boundary is then
    before that generation: the model keeps each rollout's last delivered response until the rollout
    calls again and commits it, so the restored model answers the re-issue without generating."""
    location = f"file://{tmp_path}"
    body = REQUESTS["workplace"]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(fast_worker.url)) as client:
        control = Control(client)
        delivered = await client.post("/v1/responses", json=body, headers=ident("task3-0"))
        assert delivered.json() == expected
        assert (await control.status())["live"]["delivered_kept"] == 1
        assert (await control.prepare("ck1"))["status"] == "prepared"
        committed = await control.capture_persist("ck1", location, episodes=["task3-0"])
        assert committed["records"] == 3  # the response's prompt record, a chunk and its head
        await control.resume("ck1")
        out_of_scope = await control.prepare("ck2")
        assert out_of_scope["status"] == "prepared"
        assert (await control.capture_persist("ck2", location, episodes=["other"]))["records"] == 0
        assert (await control.status())["live"]["delivered_kept"] == 0  # out of scope: the rollout finished
        await control.resume("ck2")

    async with serve(model_app(worker.url), base_url="http://fresh") as client:
        control = Control(client)
        await control.restore("ck1", location, committed["manifest_key"], committed["manifest_sha256"])
        await control.resume("ck1")
        before = await worker_tokens(worker.url)
        again = await client.post("/v1/responses", json=body, headers=ident("task3-0", 1))
        assert again.json() == expected
        assert await worker_tokens(worker.url) == before  # nothing generated
        live = (await control.status())["live"]
        assert live["tokens_reused"] == expected["usage"]["output_tokens"] and live["staged_prefixes"] == 0


def test_a_prefix_is_written_against_its_rollouts_last_ledger_entry() -> None:
    """A cut generation's prompt is its rollout's last recorded call's prompt and answer plus the new turn: its
    prompt record holds the new turn's ids and its prefix record what it generated and the log-probs (4 bytes each),
    not its whole context; they restore only with the ledger entry the prompt was written against."""
    context = list(range(100, 3100))
    log = EntryLog.of_entries([LedgerEntry.of_call("r", "c-1", Tokens.of(context, [7, 8, 9], [-0.5, -0.25, -1.0]))])
    prompt = [*context, 7, 8, 9, *range(50, 90)]  # the previous call, its answer, 40 new ids
    cut = StagedPrefix(0, "par", False, None, len(prompt), 3, Tokens.of(prompt, [11, 12, 13], [-0.5, -0.125, -2.0]))

    def records(base: tuple[bytes, ...]) -> list[RestoredRecord]:
        return [RestoredRecord(s.key, encode(s), "r", 0) for s in freeze("r", "d" * 64, cut, base)]

    written = records(tuple(log.stored))
    assert sum(len(r.data) for r in written) < 4 * (40 + 3 + 3) + 400  # new ids, generated ids, log-probs, headers
    base = array("I", [*context, 7, 8, 9])
    staged = read_records(written, lambda rollout, index: base)
    assert list(staged) == [("r", "d" * 64)] and staged["r", "d" * 64].tokens == cut.tokens
    assert staged["r", "d" * 64].attempt == 1
    with pytest.raises(InvalidState, match="does not hold"):
        read_records(written, no_ledger)  # written against an entry the checkpoint lacks
    whole = records(())  # no ledger: the prompt written whole
    assert len(whole[0].data) > 4 * len(prompt)
    assert read_records(whole, no_ledger)["r", "d" * 64].tokens == cut.tokens
    text_only = StagedPrefix(0, "par", True, "stop", None, 3, None)
    chunk, head = [
        RestoredRecord(s.key, encode(s), "r", 0) for s in freeze("r", "d" * 64, text_only, tuple(log.stored))
    ]
    assert read_records([chunk, head], no_ledger)["r", "d" * 64] == StagedPrefix(
        1, "par", True, "stop", None, 3, None, ((0, 0),)
    )
    for broken in (head.data[:-2], head.data + b"x", bytes([5, 200]) + head.data[2:], bytes([4]) + head.data[1:]):
        with pytest.raises(InvalidState):
            read_records([chunk, RestoredRecord(head.key, broken, "r", 0)], no_ledger)
    for broken in (chunk.data[:-2], chunk.data + b"x", bytes([2]) + chunk.data[1:]):
        with pytest.raises(InvalidState):
            read_records([RestoredRecord(chunk.key, broken, "r", 0), head], no_ledger)
