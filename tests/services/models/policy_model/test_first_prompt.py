"""A rollout's first prompt in the token ledger's checkpoint: a record of its own, byte for byte the prompt record its
first call's generation had while it ran, so a checkpoint after the call was stored references the prompt a
checkpoint during the call wrote (``docs/protocol.md``, "The token ledger").

The first call's prompt (system prompt, tool schemas, first message) is most of what a rollout holds that no other
call repeats; before, it was written once in the generation's prompt record and again in the ledger's first chunk."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.services.models.policy_model.test_prefix_records import capture, cut, encoded, ids, write

from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord, Scope
from gym_services.control.storage import MemoryStorage
from gym_services.control.store import CheckpointStore
from gym_services.models.policy_model.ledger.records import (
    CHUNK_LAYOUT,
    CHUNK_LAYOUT_FIRST_PROMPT,
    chunk_key,
    encoded_records,
    first_prompt_key,
    ledger_record_key,
    parse_records,
)
from gym_services.models.policy_model.ledger.rollouts import TokenLedger
from gym_services.models.policy_model.ledger.wire import LedgerEntry
from gym_services.models.policy_model.participant import captured
from gym_services.models.policy_model.prefixes import prompt_record_key

FIXTURE = Path(__file__).parents[3] / "fixtures" / "ledger_records" / "chunk_layout1.json"
#: the request digest of the rollout's first call (``test_prefix_records``' generation), its ledger call id
DIGEST = "d" * 64


def stored_call(ledger: TokenLedger, prompt: list[int], generated: list[int], call: str = DIGEST) -> LedgerEntry:
    """The call's entry as the policy model records it once the response is built (call id: the request digest)."""
    log_probs = [-(i % 17) / 8 for i in range(len(generated))]
    entry = LedgerEntry.of_call("r", call, Tokens.of(prompt, generated, log_probs), model="m")
    ledger.begin_call("r", call, 0)
    ledger.put(entry, 0)
    return entry


def by_key(records: list[RestoredRecord]) -> dict[str, RestoredRecord]:
    return {r.key: r for r in records}


def test_a_first_prompt_written_while_its_call_ran_is_not_written_again_once_the_call_is_stored() -> None:
    """Checkpoint 1 holds the rollout's first call running (its prompt record: 6,000 ids); the call finishes and is
    stored; checkpoint 2 writes the ledger's chunk (the 100 generated ids and log-probs, the prompt a varint) and its
    head, and references the first prompt in checkpoint 1's pack."""
    rng = random.Random(11)
    prompt, generated = ids(rng, 6000), ids(rng, 100)
    ledger = TokenLedger()
    during = encoded(capture(ledger, cut(prompt, generated[:40])))
    entry = stored_call(ledger, prompt, generated)
    after = encoded(captured(ledger, [], Scope()))
    records = by_key(after)
    first = records[first_prompt_key("r")]
    assert first.data == by_key(during)[prompt_record_key("r", DIGEST)].data  # byte for byte
    chunk = records[chunk_key("r", 0)]
    assert chunk.data[0] == CHUNK_LAYOUT_FIRST_PROMPT and len(chunk.data) < 8 * len(generated) + 400
    assert [e.canonical() for e in parse_records(after)["r"].parsed()] == [entry.canonical()]
    with ThreadPoolExecutor(2) as pool:
        store = CheckpointStore(MemoryStorage("ckpt"))
        one = write(store, pool, "ck-1", capture(TokenLedger(), cut(prompt, generated[:40])), [])
        two = write(store, pool, "ck-2", captured(ledger, [], Scope()), [one.index])
    assert two.reused >= 1 and two.written_bytes < 4 * len(prompt) / 2, two  # the first prompt referenced


def test_a_restored_first_entry_is_the_entry_that_was_stored_and_later_checkpoints_keep_its_bytes() -> None:
    rng = random.Random(12)
    ledger = TokenLedger()
    first = stored_call(ledger, ids(rng, 900), ids(rng, 30))
    second = stored_call(
        ledger, [*first.prompt_token_ids, *first.generation_token_ids, *ids(rng, 80)], ids(rng, 20), "e" * 64
    )
    records = encoded_records(ledger, Scope())
    restored = [RestoredRecord(r.key, r.data, r.rollout_id, r.attempt) for r in records]
    rows = parse_records(restored)["r"]
    assert rows.entries.stored == ledger.rollouts["r"].entries.stored  # the form the ledger holds: whole
    assert [e.canonical() for e in rows.parsed()] == [first.canonical(), second.canonical()]
    fresh = TokenLedger()
    fresh.install({"r": rows})
    again = by_key([RestoredRecord(r.key, r.data, r.rollout_id, r.attempt) for r in encoded_records(fresh, Scope())])
    for record in restored:  # a restore changes the head only
        if record.key != ledger_record_key("r"):
            assert again[record.key].data == record.data, record.key


def test_a_rollout_stored_under_other_call_ids_keeps_its_first_prompt_in_its_chunk() -> None:
    """An entry put by another writer (its call id is not a request digest) has no generation prompt record to share
    bytes with: its first chunk holds the prompt whole, as before."""
    rng = random.Random(13)
    ledger = TokenLedger()
    entry = stored_call(ledger, ids(rng, 500), ids(rng, 10), "c-0")
    records = encoded_records(ledger, Scope())
    assert [r.key for r in records] == [chunk_key("r", 0), ledger_record_key("r")]
    assert records[0].data[0] == CHUNK_LAYOUT
    restored = [RestoredRecord(r.key, r.data, r.rollout_id, r.attempt) for r in records]
    assert [e.canonical() for e in parse_records(restored)["r"].parsed()] == [entry.canonical()]


def test_a_missing_swapped_or_orphan_first_prompt_is_refused() -> None:
    rng = random.Random(14)
    ledger = TokenLedger()
    prompt = ids(rng, 400)
    stored_call(ledger, prompt, ids(rng, 10))
    records = by_key([RestoredRecord(r.key, r.data, "r", 0) for r in encoded_records(ledger, Scope())])
    head, chunk, first = records[ledger_record_key("r")], records[chunk_key("r", 0)], records[first_prompt_key("r")]
    other = TokenLedger()
    other.begin_call("r", "f" * 64, 0)
    other.put(LedgerEntry.of_call("r", "f" * 64, Tokens.of(prompt, [5], [-0.5]), model="m"), 0)
    another_call = next(r for r in encoded_records(other, Scope()) if r.key == first_prompt_key("r"))
    shorter, longer = TokenLedger(), TokenLedger()
    stored_call(shorter, prompt[:-1], [5])
    stored_call(longer, [*prompt, 7], [5])
    shorter_prompt = next(r for r in encoded_records(shorter, Scope()) if r.key == first_prompt_key("r"))
    longer_prompt = next(r for r in encoded_records(longer, Scope()) if r.key == first_prompt_key("r"))
    bad = {
        "missing": ([head, chunk], "first prompt record .* is missing"),
        "another call's": ([head, chunk, RestoredRecord(first.key, another_call.data, "r", 0)], "another call"),
        "a shorter prompt": ([head, chunk, RestoredRecord(first.key, shorter_prompt.data, "r", 0)], "not continue"),
        "a longer prompt": ([head, chunk, RestoredRecord(first.key, longer_prompt.data, "r", 0)], "not the 401 ids"),
        "truncated": ([head, chunk, RestoredRecord(first.key, first.data[:-2], "r", 0)], "not a prompt record"),
        "another attempt's": ([head, chunk, RestoredRecord(first.key, first.data, "r", 1)], "manifest identity"),
        "orphan": ([first], "without their head record"),
        "layout 2 past entry 0": (
            [
                RestoredRecord(head.key, json.dumps({**json.loads(head.data), "chunks": [0, 1]}).encode(), "r", 0),
                chunk,
                RestoredRecord(chunk_key("r", 1), chunk.data, "r", 0),
                first,
            ],
            "not a ledger chunk",
        ),
    }
    for name, (items, message) in bad.items():
        with pytest.raises(InvalidState, match=message):
            parse_records(items)
            pytest.fail(name)
    assert parse_records([head, chunk, first])["r"].attempt == 1


def test_chunks_of_layout_1_as_the_code_before_wrote_them_still_restore() -> None:
    """Records of ``tests/fixtures/ledger_records`` (written by the code before the first prompt record): a rollout the
    policy model recorded (request digests) and one another writer stored, each restored entry for entry."""
    fixture = json.loads(FIXTURE.read_text())
    records = [
        RestoredRecord(r["key"], base64.b64decode(r["data"]), r["rollout_id"], r["attempt"]) for r in fixture["records"]
    ]
    assert {r.data[0] for r in records if ".e" in r.key} == {CHUNK_LAYOUT}
    rows = parse_records(records)
    assert set(rows) == set(fixture["expected"])
    for rollout_id, entries in fixture["expected"].items():
        assert [json.loads(e.canonical()) for e in rows[rollout_id].parsed()] == entries, rollout_id
        assert rows[rollout_id].attempt == 2
    assert rows["r-other"].frozen
    digest = hashlib.sha256(b"request 0").hexdigest()
    assert rows["r-model"].entries.call_ids()[0] == digest
    fresh = TokenLedger()  # the next checkpoint writes the new layout
    fresh.install(rows)
    keys = {r.key: r.data for r in encoded_records(fresh, Scope())}
    assert keys[chunk_key("r-model", 0)][0] == CHUNK_LAYOUT_FIRST_PROMPT and first_prompt_key("r-model") in keys
