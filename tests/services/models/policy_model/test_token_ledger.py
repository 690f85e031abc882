"""The token ledger (``/v1/ledger/*``) in the model participant's checkpoint: rows survive a SIGKILL and a
restore under attempt + 1, attempt N's late writes are refused, and a call lost across the crash masks its
rollout. Real uvicorn processes; the in-process tests cover refusals and the records' validation."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.services.models.policy_model.model_support import REQUESTS, ident, model_app
from tests.services.models.procs import ServerProcess, start_server
from tests.support.asgi import Control, base_config, serve
from tests.support.records import model_pack_writer, publish_alone

from gym_services.base.config import ConfigError, load_config
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.manifests import parse_packed_manifest
from gym_services.control.packs import read_packed
from gym_services.control.participant import Capture, InvalidState, RestoredRecord, Scope
from gym_services.control.protocol import Role
from gym_services.control.storage import Storage, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.models.policy_model.app import Config
from gym_services.models.policy_model.ledger.client import LedgerClient, LedgerRefused
from gym_services.models.policy_model.ledger.lineage import stamp
from gym_services.models.policy_model.ledger.records import (
    CHUNK_LAYOUT,
    LEDGER_ENCODER,
    chunk_key,
    encoded_records,
    entries_key,
    frozen_records,
    ledger_record_key,
    parse_records,
)
from gym_services.models.policy_model.ledger.rollouts import NEVER_STORED, TokenLedger
from gym_services.models.policy_model.ledger.wire import LedgerEntry
from gym_services.models.policy_model.responses import ResponsesRequest, request_digest


def entry(rollout_id: str, call_id: str, generation: list[int], prompt: list[int] | None = None) -> dict[str, Any]:
    return LedgerEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model="m",
        prompt_token_ids=prompt or [1, 2, 3],
        generation_token_ids=generation,
        generation_log_probs=[-0.5 - i / 8 for i in range(len(generation))],
        output_items=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "é"}]}],
        token_item_index=0,
    ).model_dump(mode="json")


async def put(client: httpx.AsyncClient, row: dict[str, Any], attempt: int = 0) -> httpx.Response:
    return await client.post("/v1/ledger/put", json={"entry": row}, headers=ident(row["rollout_id"], attempt))


async def begin(client: httpx.AsyncClient, rollout_id: str, call_id: str, attempt: int = 0) -> httpx.Response:
    body = {"rollout_id": rollout_id, "model_call_id": call_id}
    return await client.post("/v1/ledger/begin_call", json=body, headers=ident(rollout_id, attempt))


async def freeze(client: httpx.AsyncClient, rollout_id: str) -> dict[str, Any]:
    resp = await client.post("/v1/ledger/freeze", json={"rollout_id": rollout_id})
    assert resp.status_code == 200, resp.text
    return resp.json()


def code(resp: httpx.Response) -> tuple[int, str]:
    return resp.status_code, resp.json()["error"]["code"]


def start_model(worker_url: str, workdir: Path) -> ServerProcess:
    upstream = {"base_url": f"{worker_url}/v1"}
    config = base_config("policy_model", upstream=upstream, record_tokens=True, return_token_id_information=True)
    config.pop("name")
    return start_server("policy_model", config, workdir)


async def test_ledger_rows_survive_sigkill_and_restore_retires_attempt_n(worker, tmp_path: Path) -> None:
    location = f"file://{tmp_path / 'store'}"
    rows = [entry("r-led", "call-1", [7, 8]), entry("r-led", "call-2", [9, 10, 11], prompt=[1, 2, 3, 7, 8, 4])]
    first = start_model(worker.url, tmp_path / "first")
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
            for row in rows:
                assert (await put(client, row)).status_code == 200
            assert (await begin(client, "r-led", "call-3")).status_code == 200  # in flight, never stored
            assert (await begin(client, "r-cont", "c-1")).status_code == 200  # its re-issue will complete it
            committed = await Control(client).checkpoint("ck1", location)
            # r-led: head and entries; r-cont (an intent, no entry yet): its head alone
            assert committed["records"] == 3 and committed["episodes"] == ["r-cont", "r-led"]
            # written by attempt 0 after the checkpoint: it dies with the process and never comes back
            assert (await put(client, entry("r-led", "call-4", [12]))).status_code == 200
    finally:
        first.kill()

    second = start_model(worker.url, tmp_path / "second")
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as client:
            control = Control(client)
            restored = await control.restore("ck1", location, committed["manifest_key"], committed["manifest_sha256"])
            assert restored["episodes"] == {"r-cont": 1, "r-led": 1}
            await control.resume("ck1")
            assert (await control.status())["live"]["ledger_entries"] == 2

            # attempt 0 is retired: its late writes are refused and change nothing
            assert code(await put(client, entry("r-led", "call-4", [12]))) == (409, "stale_attempt")
            late_mark = await client.post(
                "/v1/ledger/mark_incomplete",
                json={"rollout_id": "r-cont", "model_call_id": "c-1"},
                headers=ident("r-cont", 0),
            )
            assert code(late_mark) == (409, "stale_attempt")
            assert (await put(client, entry("r-cont", "c-1", [5]), attempt=1)).status_code == 200
            trainer = LedgerClient(second.url)  # what a trainer's transport uses
            try:
                with pytest.raises(LedgerRefused) as late:
                    await trainer.put(LedgerEntry.model_validate(entry("r-led", "call-5", [13])), attempt=0)
                assert (late.value.status, late.value.code) == (409, "stale_attempt")
            finally:
                await trainer.close()

            led = await freeze(client, "r-led")
            assert led["attempt"] == 1
            assert led["entries"] == rows  # byte for byte what attempt 0 stored before the checkpoint
            assert led["incomplete"] is True and led["lost_calls"] == {"call-3": NEVER_STORED}
            cont = await freeze(client, "r-cont")
            assert cont["incomplete"] is False and cont["entries"] == [entry("r-cont", "c-1", [5])]
    finally:
        second.stop()


async def test_a_model_call_lost_across_a_crash_masks_its_rollout(worker, tmp_path: Path) -> None:
    location = f"file://{tmp_path / 'store'}"
    body = REQUESTS["lean"]
    call_id = request_digest(ResponsesRequest.model_validate(body))
    first = start_model(worker.url, tmp_path / "first")
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=60) as client:
            control = Control(client)
            lost = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-lost")))
            redone = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-redo")))
            for _ in range(3000):  # both generating (bounded: 30 s)
                live = (await control.status())["live"]
                if live["generations"] == 2 and live["tokens_in_flight"] >= 4:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"the calls did not start: {live}")
            assert (await control.prepare("ck1"))["status"] == "prepared"
            committed = await control.capture_persist("ck1", location)
            assert committed["episodes"] == ["r-lost", "r-redo"]
            first.kill()  # the calls die with the process, never delivered
            for call in (lost, redone):
                with pytest.raises(httpx.HTTPError):
                    await call
    finally:
        first.kill()

    second = start_model(worker.url, tmp_path / "second")
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=60) as client:
            control = Control(client)
            await control.restore("ck1", location, committed["manifest_key"], committed["manifest_sha256"])
            await control.resume("ck1")
            # r-redo's agent re-issues the call (attempt 1) and it completes from its prefix; r-lost's never comes
            answer = await client.post("/v1/responses", json=body, headers=ident("r-redo", 1))
            assert answer.status_code == 200, answer.text

            lost_rows = await freeze(client, "r-lost")
            assert lost_rows["incomplete"] is True and lost_rows["entries"] == []
            assert lost_rows["lost_calls"] == {call_id: NEVER_STORED}
            # the re-issued call was recorded under attempt 1
            redo_rows = await freeze(client, "r-redo")
            assert redo_rows["attempt"] == 1
            assert redo_rows["incomplete"] is False and redo_rows["lost_calls"] == {}
            (stored,) = redo_rows["entries"]
            assert stored["model_call_id"] == call_id and stored["continuation_fingerprint"]
            assert len(stored["generation_token_ids"]) == answer.json()["usage"]["output_tokens"]
            # the entry holds what the response gave the agent: the token fields of its last output item
            output = answer.json()["output"]
            for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
                assert stored[name] == output[-1][name], name
            assert stored["token_item_index"] == len(output) - 1
            assert all("generation_token_ids" not in item for item in stored["output_items"])
    finally:
        second.stop()


# --- in process: refusals and records --------------------------------------------------------------


def test_the_old_config_key_capture_tokens_is_read_as_record_tokens_with_a_warning(monkeypatch) -> None:
    upstream = {"base_url": "http://127.0.0.1:9/v1"}
    with pytest.warns(FutureWarning, match="'capture_tokens' is deprecated: call it 'record_tokens'"):
        old = load_config(Config, overrides=base_config("m", upstream=upstream, capture_tokens=True))
    assert old.record_tokens is True and "capture_tokens" not in old.model_dump()
    with pytest.raises(ConfigError, match="set only record_tokens"):
        load_config(Config, overrides=base_config("m", upstream=upstream, capture_tokens=True, record_tokens=True))
    monkeypatch.setenv("GYMCKPT__RECORD_TOKENS", "true")
    assert load_config(Config, overrides=base_config("m", upstream=upstream)).record_tokens is True


async def test_bad_writes_get_a_clear_4xx_and_change_nothing(worker) -> None:
    async with serve(model_app(worker.url)) as client:
        row = entry("r-bad", "c-1", [4, 5])
        assert (await put(client, row)).status_code == 200
        no_identity = await client.post("/v1/ledger/put", json={"entry": row})
        assert code(no_identity) == (400, "rollout_id_required")
        other = await client.post("/v1/ledger/put", json={"entry": row}, headers=ident("r-other"))
        assert code(other) == (400, "bad_request")
        uneven = {**row, "model_call_id": "c-2", "generation_log_probs": [-1.0]}
        assert code(await put(client, uneven)) == (400, "bad_request")
        newer = {**row, "model_call_id": "c-3", "schema_version": 2}
        assert code(await put(client, newer)) == (400, "bad_request")
        frozen = await freeze(client, "r-bad")
        assert frozen["entries"] == [row] and frozen["incomplete"] is False

        assert code(await put(client, entry("r-bad", "c-4", [1]))) == (409, "ledger_closed")
        assert code(await begin(client, "r-bad", "c-5")) == (409, "ledger_closed")
        assert await freeze(client, "r-bad") == frozen
        drop = {"rollout_id": "r-bad", "snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
        assert (await client.post("/v1/ledger/drop", json=drop)).json() == {"dropped": True}
        assert (await client.post("/v1/ledger/drop", json=drop)).json() == {"dropped": False}
        assert code(await put(client, entry("r-bad", "c-6", [1]))) == (409, "ledger_closed")  # remembered as dropped
        assert code(await client.post("/v1/ledger/freeze", json={"rollout_id": "r-bad"})) == (409, "ledger_closed")


async def test_conflicting_payload_is_refused_and_masks_the_rollout(worker) -> None:
    async with serve(model_app(worker.url)) as client:
        assert (await put(client, entry("r-c", "c-1", [4, 5]))).status_code == 200
        assert (await put(client, entry("r-c", "c-1", [4, 5]))).json()["stored"] is False  # an identical retry
        assert code(await put(client, entry("r-c", "c-1", [4, 6]))) == (409, "ledger_conflict")
        frozen = await freeze(client, "r-c")
        assert frozen["incomplete"] is True and frozen["entries"] == [entry("r-c", "c-1", [4, 5])]


async def test_retire_drops_the_attempts_rows_and_refuses_its_late_writes(worker) -> None:
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        assert (await put(client, entry("r-r", "c-1", [4]))).status_code == 200
        assert (await control.retire("r-r", 0))["retired"] is True
        ledger: TokenLedger = client._transport.app.state.ledger  # type: ignore[attr-defined]
        with pytest.raises(ApiError) as refused:  # the ledger itself refuses, behind the admission fence
            ledger.put(LedgerEntry.model_validate(entry("r-r", "c-2", [4])), attempt=0)
        assert refused.value.code == ErrorCode.STALE_ATTEMPT
        assert (await put(client, entry("r-r", "c-1", [4, 4]), attempt=1)).status_code == 200
        assert (await freeze(client, "r-r"))["entries"] == [entry("r-r", "c-1", [4, 4])]


def test_restore_refuses_a_bad_ledger_record_and_bumps_the_version() -> None:
    ledger = TokenLedger()
    ledger.put(LedgerEntry.model_validate(entry("r-v", "c-1", [3])), attempt=2)
    ledger.begin_call("r-v", "c-2", attempt=2)
    frozen = ledger.freeze("r-v")
    chunk, head = encoded_records(ledger, Scope())
    assert (
        head.key == ledger_record_key("r-v")
        and chunk.key == chunk_key("r-v", 0)
        and head.attempt == chunk.attempt == 2
        and chunk.data[0] == CHUNK_LAYOUT  # binary, not JSON
    )
    restored = parse_records([RestoredRecord(r.key, r.data, "r-v", 2) for r in (head, chunk)])
    assert restored["r-v"].attempt == 3 and restored["r-v"].version == frozen.version + 1
    fresh = TokenLedger()
    fresh.install(restored)
    again = fresh.freeze("r-v")
    assert again.snapshot_id == frozen.snapshot_id and again.entries == frozen.entries
    assert again.lost_calls == frozen.lost_calls == {"c-2": NEVER_STORED}
    assert fresh.drop("r-v", frozen.snapshot_id, frozen.version) is False  # consumed before the restore: stale

    good = RestoredRecord(chunk.key, chunk.data, "r-v", 2)
    fields = json.loads(head.data)
    other = TokenLedger()
    other.put(LedgerEntry.model_validate(entry("r-w", "c-1", [3])), attempt=2)
    other_chunk, _ = encoded_records(other, Scope())

    def with_head(**changed: Any) -> RestoredRecord:
        return RestoredRecord(head.key, json.dumps({**fields, **changed}).encode(), "r-v", 2)

    bad = [
        [RestoredRecord(head.key, b"{", "r-v", 2), good],
        [RestoredRecord(head.key, head.data, "r-v", 1), good],
        [RestoredRecord(ledger_record_key("r-w"), head.data, "r-v", 2), good],
        [with_head(schema_version=9), good],
        [with_head(), RestoredRecord(chunk.key, other_chunk.data, "r-v", 2)],  # another rollout's entries
        [with_head()],  # its chunk missing
        [good],  # a chunk without its head
        [with_head(entries=2), good],
        [with_head(chunks=[1]), good],
        [with_head(intents=[0, 5]), good],  # an intent naming no entry
        [with_head(), RestoredRecord(chunk.key, chunk.data, "r-v", 1)],
        [with_head(), RestoredRecord(chunk.key, chunk.data[:-3], "r-v", 2)],  # truncated
        [with_head(), RestoredRecord(chunk.key, b"{}" + chunk.data, "r-v", 2)],
    ]
    for items in bad:
        with pytest.raises(InvalidState):
            parse_records(items)


def test_ledger_records_of_schema_2_and_1_still_restore() -> None:
    """Schema 2 (a JSON head and a JSON entries record) and schema 1 (one JSON record, entries inline), as the
    code before the binary chunks wrote them (their bytes: ``tests/fixtures/token_records``)."""
    put = LedgerEntry.model_validate(entry("r-v", "c-1", [3, 4]))
    head = {
        "schema_version": 2,
        "rollout_id": "r-v",
        "attempt": 2,
        "entries": 1,
        "intents": ["c-1", "c-2"],
        "lost": {},
        "frozen": False,
        "snapshot_id": "",
        "version": 3,
        "dropped": False,
    }
    stored = {"schema_version": 2, "rollout_id": "r-v", "entries": [json.loads(put.canonical())]}
    v2 = [
        RestoredRecord(ledger_record_key("r-v"), json.dumps(head).encode(), "r-v", 2),
        RestoredRecord(entries_key("r-v"), json.dumps(stored).encode(), "r-v", 2),
    ]
    v1 = {**head, "schema_version": 1, "entries": stored["entries"]}
    v1_record = RestoredRecord(ledger_record_key("r-v"), json.dumps(v1).encode(), "r-v", 2)
    for records in (v2, [v1_record]):
        rows = parse_records(records)["r-v"]
        assert rows.attempt == 3 and rows.version == 4 and rows.dangling() == ["c-2"]
        assert [e.canonical() for e in rows.parsed()] == [put.canonical()]
    for items in (
        [v2[0]],  # its entries record missing
        [v1_record, v2[1]],  # schema 1 with an entries record beside
        [v2[0], RestoredRecord(entries_key("r-v"), json.dumps({**stored, "rollout_id": "r-w"}).encode(), "r-v", 2)],
    ):
        with pytest.raises(InvalidState):
            parse_records(items)


async def test_resolve_names_the_call_a_request_continues(worker) -> None:
    request = [{"role": "user", "content": "Plan a trip"}]
    first = LedgerEntry.model_validate(entry("r-l", "c-1", [7, 8]))
    stamp(first, request)
    async with serve(model_app(worker.url)) as client:
        assert (await put(client, first.model_dump(mode="json"))).status_code == 200

        async def resolve(items: list) -> httpx.Response:
            return await client.post("/v1/ledger/resolve", json={"rollout_id": "r-l", "request_items": items})

        follow_up = [*request, *first.output_items, {"role": "user", "content": "and back?"}]
        found = (await resolve(follow_up)).json()
        assert found["status"] == "resolved" and found["model_call_id"] == "c-1"
        assert found["cumulative_token_ids"] == [1, 2, 3, 7, 8]
        rewritten = [{"role": "user", "content": "Plan a cruise"}, *first.output_items]
        assert (await resolve(rewritten)).json()["status"] == "unresolved"
        assert (await resolve(request)).json()["status"] == "root"
        assert code(await resolve([*request, {"role": "assistant", "content": [7]}])) == (400, "bad_request")
        assert code(await client.post("/v1/ledger/resolve", json={"rollout_id": "r-l", "request_items": [1]})) == (
            400,
            "bad_request",
        )


async def test_the_packed_format_keeps_the_ledger_as_captured_under_the_pause(worker, tmp_path: Path) -> None:
    location = f"file://{tmp_path}"
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        assert (await put(client, entry("r-s", "c-1", [4, 5]))).status_code == 200
        assert (await control.prepare("ck"))["status"] == "prepared"
        assert code(await put(client, entry("r-s", "c-9", [9]))) == (409, "checkpoint_parked")
        await control.call("capture", {"checkpoint_id": "ck", "location": location})
        await control.resume("ck")
        # encoded after resume: a write now must not reach the captured record
        assert (await put(client, entry("r-s", "c-2", [6]))).status_code == 200
        persisted = await control.call("persist", {"checkpoint_id": "ck"})
        assert persisted["records"] == 2  # the ledger's head and entries
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        await control.restore("ck", location, persisted["manifest_key"], persisted["manifest_sha256"])
        await control.resume("ck")
        frozen = await freeze(client, "r-s")
        assert frozen["attempt"] == 1 and frozen["entries"] == [entry("r-s", "c-1", [4, 5])]


async def test_a_finished_rollouts_ledger_outlives_a_scoped_commit_until_the_trainer_drops_it(worker, tmp_path) -> None:
    location = f"file://{tmp_path}"
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        assert (await put(client, entry("r-done", "c-1", [4]))).status_code == 200
        assert (await put(client, entry("r-live", "c-1", [5]))).status_code == 200
        committed = await control.checkpoint("ck", location, episodes=["r-live"])  # r-done finished
        assert committed["records"] == 4 and committed["episodes"] == ["r-live"]  # each rollout: head and entries
        assert (await freeze(client, "r-done"))["entries"] == [entry("r-done", "c-1", [4])]  # not released
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        restored = await control.restore("ck", location, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["episodes"] == {"r-live": 1}
        await control.resume("ck")
        done = await freeze(client, "r-done")
        assert done["entries"] == [entry("r-done", "c-1", [4])] and done["attempt"] == 1
        missing = await client.post("/v1/ledger/freeze", json={"rollout_id": "r-never"})
        assert code(missing) == (404, "not_found")  # never an empty answer a trainer could take for a rollout


def test_a_restored_unchanged_ledger_is_referenced_by_the_next_checkpoint_not_rewritten(tmp_path: Path) -> None:
    """A restore installs every rollout's rows under attempt + 1, which changes each ledger's head; the entries
    (the tokens, nearly all the bytes) are unchanged and the first checkpoint after the restore references them
    in the restored checkpoint's packs (it used to write every finished rollout's tokens again)."""
    storage = open_storage(f"file://{tmp_path}/ckpt")
    ledger = TokenLedger()
    for i in range(6):
        for call in range(3):
            ledger.put(LedgerEntry.model_validate(entry(f"r-{i}", f"c-{call}", list(range(200)))), attempt=0)
    ledger.freeze("r-0")
    with ThreadPoolExecutor(4) as pool:
        first = write_pack(storage, pool, "c-1", frozen_records(ledger, Scope()))
        publish(storage, "c-1", first)
        manifest = parse_packed_manifest(storage.get(first.manifest.key))
        records, index = asyncio.run(read_packed(CheckpointStore(storage), pool, manifest))
        restored = TokenLedger()
        restored.install(parse_records(records))
        assert {r: restored.rollouts[r].attempt for r in restored.rollouts} == {f"r-{i}": 1 for i in range(6)}
        restored.put(LedgerEntry.model_validate(entry("r-5", "c-9", [7])), attempt=1)  # one rollout moves on
        second = write_pack(storage, pool, "c-2", frozen_records(restored, Scope()), reuse=[index])
        publish(storage, "c-2", second)
        # every rollout's chunk; every head and r-5's new chunk are written
        assert second.reused == 6
        assert first.records == 12 and second.records == 13
        assert second.written_bytes < first.written_bytes / 3
        manifest = parse_packed_manifest(storage.get(second.manifest.key))
        again, _ = asyncio.run(read_packed(CheckpointStore(storage), pool, manifest))
    back = parse_records(again)
    assert back["r-5"].attempt == 2 and back["r-5"].entries.call_ids() == ["c-0", "c-1", "c-2", "c-9"]
    assert back["r-0"].frozen and len(back["r-0"].entries) == 3


def write_pack(storage: Storage, pool: ThreadPoolExecutor, cid: str, pending: list, reuse=()):
    writer = model_pack_writer(pool, LEDGER_ENCODER, pack_bytes=4096)
    return writer.write(CheckpointStore(storage), Capture(pending), cid, reuse)


def publish(storage: Storage, cid: str, written) -> None:
    publish_alone(CheckpointStore(storage), cid, written, "policy-model", Role.MODEL)


def test_a_held_ledger_costs_its_new_tokens_once_not_its_json() -> None:
    """A rollout's ledger is held until the trainer drops it. Each call's prompt repeats the previous call's prompt
    and answer, so held as JSON (5-6 bytes per id, every prompt whole) a rollout cost the square of its turns; held
    in its stored form, each entry costs its new ids and its generated ids and log-probs, 4 bytes each, and its
    output items. Measured as the bytes the ledger retains (tracemalloc), not time."""
    texts = []
    for i in range(8):
        sequence: list[int] = []
        for call in range(6):
            prompt = [*sequence, *range(5000 + call * 400, 5400 + call * 400)]  # 400 new ids a turn
            row = entry(f"r-{i}", f"c-{call}", list(range(1000 + call, 1300 + call)), prompt=prompt)
            texts.append(LedgerEntry.model_validate(row).model_dump_json())
            sequence = prompt + row["generation_token_ids"]
    json_bytes = sum(len(text) for text in texts)
    floor = 8 * (6 * 400 * 4 + 6 * 300 * 8)  # every rollout's new prompt ids, generated ids and log-probs
    for text in texts:  # pydantic-core's parse caches fill once: not the ledger's
        LedgerEntry.model_validate_json(text)
    ledger = TokenLedger()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            ledger.put(LedgerEntry.model_validate_json(text), attempt=0)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert floor < ledger.held < 1.3 * floor, (ledger.held, floor)
    assert retained < 1.3 * ledger.held and retained < json_bytes / 3, (retained, ledger.held, json_bytes)
    frozen = ledger.freeze("r-3")  # a read decodes the stored forms: the entries as they were put
    assert [e.model_dump_json() for e in frozen.entries] == texts[18:24]
    assert ledger.drop("r-3", frozen.snapshot_id, frozen.version)
    assert ledger.counts()["ledger_entries"] == 42 and not ledger.rollouts["r-3"].entries


def dropped(ledger: TokenLedger, rollouts: list[str]) -> None:
    """Each rollout: one call stored, then frozen and dropped as a trainer does."""
    for rollout in rollouts:
        ledger.put(LedgerEntry.model_validate(entry(rollout, "c-1", [7])), attempt=0)
        frozen = ledger.freeze(rollout)
        assert ledger.drop(rollout, frozen.snapshot_id, frozen.version)


def test_a_finished_rollout_the_trainer_dropped_is_in_no_later_checkpoint() -> None:
    """A dropped rollout used to leave its head in every later checkpoint (the soak's bytes per checkpoint grew
    all through a job). A finished rollout (out of the checkpoint's scope) whose ledger was dropped writes
    nothing; a live one's head (dropped, no rows) is still written, so a restore keeps refusing its writes."""
    ledger = TokenLedger()
    dropped(ledger, [f"r-{i}" for i in range(20)])
    ledger.put(LedgerEntry.model_validate(entry("r-live", "c-1", [1])), attempt=0)
    captured = frozen_records(ledger, Scope.of(["r-live", "r-3"]))  # r-3: dropped while the controller runs it
    assert [p.key for p in captured] == [
        chunk_key("r-live", 0),
        ledger_record_key("r-3"),
        ledger_record_key("r-live"),
    ]
    restored = TokenLedger()
    records = [RestoredRecord(p.key, LEDGER_ENCODER.encode(p.state), p.rollout_id, p.attempt) for p in captured]
    restored.install(parse_records(records))
    with pytest.raises(ApiError) as refused:
        restored.put(LedgerEntry.model_validate(entry("r-3", "c-2", [1])), attempt=1)
    assert refused.value.code == ErrorCode.LEDGER_CLOSED


def test_a_bounded_number_of_dropped_rollouts_is_remembered() -> None:
    """Each dropped rollout used to be remembered (about 0.5 KB) for the life of the process. Only the newest
    ``dropped_kept`` are, each still refusing a late write; counted as held ledgers, not bytes."""
    ledger = TokenLedger(dropped_kept=4)
    dropped(ledger, [f"r-{i:02}" for i in range(50)])
    assert sorted(ledger.rollouts) == ["r-46", "r-47", "r-48", "r-49"]
    assert ledger.counts()["ledger_retired"] == 4
    with pytest.raises(ApiError) as refused:
        ledger.put(LedgerEntry.model_validate(entry("r-49", "c-2", [1])), attempt=0)
    assert refused.value.code == ErrorCode.LEDGER_CLOSED
    assert ledger.retire("r-48", 0) is False  # a retire replaces a dropped rollout with the next attempt's empty ledger
    dropped(ledger, ["r-50", "r-51", "r-52"])
    assert sorted(ledger.rollouts) == ["r-48", "r-49", "r-50", "r-51", "r-52"]
    assert ledger.rollouts["r-48"].attempt == 1 and not ledger.rollouts["r-48"].dropped
    assert ledger.counts()["ledger_retired"] == 4
