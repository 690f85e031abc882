"""Cut generations continue token-exactly: across checkpoint -> SIGKILL -> restore, and across a worker failover.

Real uvicorn processes on 127.0.0.1 (policy models, paced inference workers), real SIGKILL. Many
rollouts of the same request are started apart, so at the moment of the cut (a checkpoint's
prepare, a worker's SIGKILL) they stand at many consecutive token positions: inside words, inside
multi-byte characters (the Lean proof's ``ℝ``, ``₀``, ``∧``), inside tool-call arguments: each
rollout is started so that it stands at its own position of those regions when the cut comes. Every final
response must carry the uninterrupted run's ``generation_token_ids`` and ``generation_log_probs``
(and equal it whole). Where each checkpoint cut landed is read from the checkpoint's prefix records
(their token ids), and the test requires every kind of cut position to occur.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.services.models.policy_model.model_support import REQUESTS, ident, model_app
from tests.services.models.procs import ServerProcess, running, start_server
from tests.support.asgi import Control, base_config, serve
from tests.support.records import restored_records

from gym_services.models import tool_markup
from gym_services.models.inference_worker.tokenizer import decode_bytes
from gym_services.models.policy_model.ledger.records import entry_sequence, is_ledger_record, parse_records
from gym_services.models.policy_model.prefixes import PREFIX_SCHEMA_VERSION, prefix_record_key
from gym_services.models.policy_model.prefixes import read_records as read_prefix_records

pytestmark = pytest.mark.e2e

TPS = 20
SAMPLING = {"temperature": 0.7, "seed": 1234}


def request(name: str) -> dict[str, Any]:
    return {**REQUESTS[name], **SAMPLING}


def token_model_config(worker_urls: list[str], **extra: Any) -> dict[str, Any]:
    config = base_config(
        "policy_model",
        upstream={"base_url": [f"{url}/v1" for url in worker_urls], "health_interval_s": 0.2},
        upstream_retry={"deadline_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.3},
        return_token_id_information=True,
        **extra,
    )
    config.pop("name")
    return config


async def uninterrupted(fast_url: str, body: dict[str, Any]) -> dict[str, Any]:
    app = model_app(fast_url, return_token_id_information=True)
    async with serve(app) as client:
        resp = await client.post("/v1/responses", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()


def tokens_of(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    last = response["output"][-1]
    return last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]


def cut_kinds(ids: list[int]) -> set[str]:
    """Where a prefix of these generated ids ends: inside a multi-byte character, a word, tool-call arguments."""
    data = decode_bytes(ids)
    kinds = set()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        kinds.add("inside a character")
        text = data.decode("utf-8", "ignore")
    if text and text[-1].isalnum():
        kinds.add("at a word's end or inside it")
    open_at = text.rfind(tool_markup.OPEN)
    if open_at >= 0 and tool_markup.CLOSE not in text[open_at:] and '"arguments"' in text[open_at:]:
        kinds.add("inside tool-call arguments")
    return kinds


def inside_word(ids: list[int], full: list[int]) -> bool:
    """The cut splits a word: the last char before and the first char after are both word characters."""
    before = decode_bytes(ids).decode("utf-8", "ignore")
    after = decode_bytes(full[len(ids) :]).decode("utf-8", "ignore")
    return bool(before and after and before[-1].isalnum() and after[0].isalnum())


def positions(full: list[int], kind: str, margin: int = 4) -> list[int]:
    """Every token position whose cut is of ``kind``, widened by ``margin`` on each side of the region."""
    hits = [
        k
        for k in range(1, len(full) - 1)
        if kind in cut_kinds(full[:k]) or (kind == "inside a word" and inside_word(full[:k], full))
    ]
    assert hits, kind
    return list(range(max(1, hits[0] - margin), min(len(full) - 1, hits[-1] + margin) + 1))


def stops(full_ids: dict[str, list[int]]) -> dict[str, int]:
    """How far each request runs before the final cut: just past the Lean proof's multi-byte characters,
    just past the Workplace tool call's arguments."""
    return {
        "lean": positions(full_ids["lean"], "inside a character", margin=1)[-1],
        "workplace": positions(full_ids["workplace"], "inside tool-call arguments", margin=1)[-1],
    }


async def start_staggered(client: httpx.AsyncClient, name: str, count: int) -> dict[str, asyncio.Task]:
    """``count`` rollouts of one request, one token apart."""
    calls: dict[str, asyncio.Task] = {}
    for i in range(count):
        calls[f"{name}-{i}"] = asyncio.create_task(call(client, request(name), f"{name}-{i}"))
        await asyncio.sleep(1 / TPS)
    return calls


async def call(client: httpx.AsyncClient, body: dict[str, Any], rollout: str) -> httpx.Response:
    """One model call, sent again while a checkpoint parks it (as an agent does after the resume)."""
    for _ in range(400):
        response = await client.post("/v1/responses", json=body, headers=ident(rollout, 0))
        if response.status_code != 409 or response.json()["error"]["code"] != "checkpoint_parked":
            return response
        await asyncio.sleep(0.02)
    raise AssertionError(f"{rollout} stayed parked")


def read_records(location: str, persisted: dict[str, Any]) -> list[dict[str, Any]]:
    """The prefix records of one checkpoint of the model (its packed manifest, named by the persist answer), read as
    a restore reads them: rollout, generated ids, complete, the head's schema version (its first byte) and how many
    records the generation has (its head, prompt record and chunks)."""
    stored = restored_records(location, persisted["manifest_key"])
    ledgers = parse_records([r for r in stored if is_ledger_record(r.key)])
    schemas = {r.key: r.data[0] for r in stored}
    read = []
    staged_prefixes = read_prefix_records(
        [r for r in stored if not is_ledger_record(r.key)], lambda rid, i: entry_sequence(ledgers[rid], i)
    )
    for (rollout_id, digest), staged in staged_prefixes.items():
        assert staged.tokens is not None
        ids = list(staged.tokens.generation_token_ids)
        key = prefix_record_key(rollout_id, digest)
        count = sum(1 for r in stored if r.key.startswith(key))
        read.append(
            {
                "rollout_id": rollout_id,
                "token_ids": ids,
                "complete": staged.complete,
                "schema": schemas[key],
                "records": count,
            }
        )
    return read


@pytest.fixture
def paced_worker(tmp_path: Path) -> Iterator[ServerProcess]:
    with running("inference_worker", {"tokens_per_second": TPS}, tmp_path / "paced") as proc:
        yield proc


async def test_checkpoint_sigkill_restore_continues_every_cut_token_exactly(
    paced_worker, fast_worker, tmp_path
) -> None:
    expected = {name: await uninterrupted(fast_worker.url, request(name)) for name in ("lean", "workplace")}
    full_ids = {name: tokens_of(resp)[1] for name, resp in expected.items()}
    stop = stops(full_ids)
    location = f"file://{tmp_path / 'store'}"
    first = start_server("policy_model", token_model_config([paced_worker.url]), tmp_path / "model-1")
    rounds: list[str] = []
    persisted: list[dict[str, Any]] = []  # each round's persist answer (names its manifest)
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=60) as client:
            control = Control(client)
            calls = await start_staggered(client, "lean", 8)
            calls.update(await start_staggered(client, "workplace", 6))
            # checkpoint rounds (prepare, capture + persist, resume) cut every running generation wherever it is; the
            # round that finds both lead rollouts past their stops is the last: the model is SIGKILLed
            for _ in range(300):
                await asyncio.sleep(0.2)
                rounds.append(f"ck-round-{len(rounds)}")
                assert (await control.prepare(rounds[-1], deadline_s=30))["status"] == "prepared"
                committed = await control.capture_persist(rounds[-1], location, episodes=list(calls))
                persisted.append(committed)
                reached = {r["rollout_id"]: len(r["token_ids"]) for r in read_records(location, committed)}
                if reached.get("lean-0", 0) >= stop["lean"] and reached.get("workplace-0", 0) >= stop["workplace"]:
                    break
                await control.resume(rounds[-1])
            else:
                raise AssertionError("the lead rollouts never reached their stops")
            first.kill()  # SIGKILL: no shutdown hook runs
            ended = await asyncio.gather(*calls.values(), return_exceptions=True)
    finally:
        first.stop()
    # a rollout of the shorter request can finish between two rounds (a loaded machine reads its answer late):
    # it was answered whole before the crash (the checkpoint may still hold it complete); every other one is restored
    finished = {
        r: e for r, e in zip(calls, ended, strict=True) if isinstance(e, httpx.Response) and e.status_code == 200
    }
    for rollout, answer in finished.items():
        assert answer.json() == expected[rollout.split("-")[0]], rollout
    bodies = {rollout: request(rollout.split("-")[0]) for rollout in calls if rollout not in finished}
    final = rounds[-1]

    records = read_records(location, committed)
    assert bodies.keys() <= {r["rollout_id"] for r in records}  # every unfinished rollout is in the checkpoint
    kinds: set[str] = set()
    for record in [r for answer in persisted for r in read_records(location, answer)]:
        name = record["rollout_id"].split("-")[0]
        assert record["schema"] == PREFIX_SCHEMA_VERSION
        ids = record["token_ids"]
        assert ids == full_ids[name][: len(ids)]  # every prefix is what was sampled, id for id
        if 0 < len(ids) < len(full_ids[name]) and not record["complete"]:
            kinds |= cut_kinds(ids)
            if inside_word(ids, full_ids[name]):
                kinds.add("inside a word")
    assert {"inside a character", "inside a word", "inside tool-call arguments"} <= kinds, kinds

    second = start_server("policy_model", token_model_config([paced_worker.url]), tmp_path / "model-2")
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=120) as client:
            control = Control(client)
            restored = await control.restore(final, location, committed["manifest_key"], committed["manifest_sha256"])
            # each generation's head, prompt record and chunks (at least one)
            assert restored["records"] == sum(r["records"] for r in records) >= 3 * len(records)
            await control.resume(final)
            answers = await asyncio.gather(
                *(
                    client.post("/v1/responses", json=body, headers=ident(rollout, 1))
                    for rollout, body in bodies.items()
                )
            )
            live = (await control.status())["live"]
    finally:
        second.stop()
    for (rollout, _), answer in zip(bodies.items(), answers, strict=True):
        name = rollout.split("-")[0]
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert tokens_of(got) == tokens_of(expected[name]), rollout
        assert got == expected[name], rollout
    # every captured token was continued, none generated again: the second model reused exactly what the records
    # held and generated the rest (the first model's streams went on after the last capture, until the SIGKILL: a
    # crash loses what was generated since the newest checkpoint, and nothing before it)
    restored = sum(len(full_ids[rollout.split("-")[0]]) for rollout in bodies)
    assert live["tokens_reused"] == sum(len(r["token_ids"]) for r in records if r["rollout_id"] in bodies)
    assert live["tokens_reused"] + live["tokens_generated"] == restored


async def test_worker_failover_continues_every_cut_token_exactly(fast_worker, tmp_path) -> None:
    expected = {name: await uninterrupted(fast_worker.url, request(name)) for name in ("lean", "workplace")}
    full_ids = {name: tokens_of(resp)[1] for name, resp in expected.items()}
    dying = start_server("inference_worker", {"tokens_per_second": TPS}, tmp_path / "dying")
    try:
        with running("inference_worker", {"tokens_per_second": TPS}, tmp_path / "survivor") as survivor:
            app = model_app(
                dying.url,
                upstream={"base_url": [f"{dying.url}/v1", f"{survivor.url}/v1"], "health_interval_s": 0.2},
                upstream_retry={"deadline_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.3},
                return_token_id_information=True,
            )
            async with serve(app) as client:
                calls = await start_staggered(client, "workplace", 6)
                calls.update(await start_staggered(client, "lean", 8))
                await asyncio.sleep(2.5)
                dying.kill()
                # the generations that were streaming from it when it died, each at its own position
                mid_stream = {
                    g.identity.rollout_id
                    for g in app.state.generations.live.values()
                    if g.identity is not None
                    and 0 < len(g.generation_token_ids) < len(full_ids[g.identity.rollout_id.split("-")[0]])
                }
                answers = {rollout: await asyncio.wait_for(task, 120) for rollout, task in calls.items()}
                live = (await Control(client).status())["live"]
    finally:
        dying.stop()
    for rollout, answer in answers.items():
        name = rollout.split("-")[0]
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert tokens_of(got) == tokens_of(expected[name]), rollout
        assert got == expected[name], rollout
    # about half the rollouts were streaming from the worker that died
    assert live["upstream_failures"] >= 3 and live["tokens_reused"] > 0 and len(mid_stream) >= 3
