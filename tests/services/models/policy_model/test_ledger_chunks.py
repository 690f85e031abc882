"""The token ledger's checkpoint records on the in-memory storage: a checkpoint writes what was added since the
previous one (its new chunks, the heads), references the rest, and deletion keeps every chunk a published checkpoint
still reads; a slow trainer's rollouts hold new ones back (``ledger.max_bytes``)."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.support.records import model_pack_writer, publish_alone

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.tokens import Tokens
from gym_services.control.manifests import parse_packed_manifest
from gym_services.control.packs import PersistResult, ReuseIndex, read_packed
from gym_services.control.participant import Capture, Scope
from gym_services.control.protocol import Role
from gym_services.control.retention import Retention
from gym_services.control.storage import MemoryStorage
from gym_services.control.store import CheckpointStore
from gym_services.models.policy_model.ledger.records import LEDGER_ENCODER, frozen_records, parse_records
from gym_services.models.policy_model.ledger.rollouts import TokenLedger
from gym_services.models.policy_model.ledger.wire import LedgerEntry

NEW_IDS, GENERATED = 300, 40


def call(ledger: TokenLedger, rollout_id: str, rng: random.Random) -> int:
    """One more call of the rollout: its prompt the rollout's last sequence and NEW_IDS new ids; returns the tokens
    it added (new ids and generated ids: each 8 bytes in the target, an id and a log-prob)."""
    rows = ledger.rollouts.get(rollout_id)
    sequence = list(next(reversed(list(rows.entries.sequences())))) if rows is not None and rows.entries else []
    prompt = sequence + [rng.randrange(150_000) for _ in range(NEW_IDS)]
    generated = [rng.randrange(150_000) for _ in range(GENERATED)]
    log_probs = [float(i) / -64 for i in range(GENERATED)]
    index = len(rows.entries) if rows is not None else 0
    entry = LedgerEntry.of_call(rollout_id, f"c-{index}", Tokens.of(prompt, generated, log_probs), model="m")
    ledger.put(entry, attempt=0)
    return NEW_IDS + GENERATED


def write(store: CheckpointStore, pool, cid: str, ledger: TokenLedger, reuse: list[ReuseIndex]) -> PersistResult:
    """One checkpoint of the model participant: written, then published as the coordinator does."""
    store.claim(cid, f"tx-{cid}", "test", ["policy-model"])
    writer = model_pack_writer(pool, LEDGER_ENCODER, pack_bytes=64 * 1024)
    written = writer.write(store, Capture(frozen_records(ledger, Scope())), cid, reuse)
    publish_alone(store, cid, written, "policy-model", Role.MODEL)
    return written


def test_a_checkpoint_writes_what_was_added_and_deletion_keeps_the_chunks_still_read() -> None:
    rng = random.Random(7)
    ledger = TokenLedger()
    rollouts = [f"r-{i}" for i in range(24)]
    held = sum(call(ledger, r, rng) for r in rollouts for _ in range(4))
    store = CheckpointStore(MemoryStorage("ckpt"))
    with ThreadPoolExecutor(4) as pool:
        first = write(store, pool, "ck-1", ledger, [])
        floor = 4 * (held + 4 * len(rollouts) * GENERATED)  # every distinct id and every log-prob, 4 bytes each
        assert floor < first.bytes < 1.4 * floor  # and each entry's other fields, each rollout's head
        added = sum(call(ledger, r, rng) for r in rollouts[:6])  # six rollouts took one more turn
        second = write(store, pool, "ck-2", ledger, [first.index])
        # every earlier chunk, and the heads of the rollouts that did not move, referenced: not written again
        assert second.reused == len(rollouts) + len(rollouts[6:])
        assert second.written_bytes <= 2 * 8 * added, (second.written_bytes, added)
        retention = Retention(store)
        kept = retention.kept_for_others("ck-1")
        assert kept and all(readers == ["ck-2"] for readers in kept.values())
        retention.delete("ck-1")
        assert retention.prune() == []  # ck-2 still reads ck-1's packs: nothing of them is collected
        manifest = parse_packed_manifest(store.storage.get(second.manifest.key))
        records, _ = asyncio.run(read_packed(store, pool, manifest))
    restored = parse_records(records)
    for rollout_id in rollouts:
        want = [e.canonical() for e in ledger.rollouts[rollout_id].parsed()]
        assert [e.canonical() for e in restored[rollout_id].parsed()] == want


async def test_a_new_rollout_waits_while_the_ledger_holds_more_than_its_bound() -> None:
    rng = random.Random(3)
    ledger = TokenLedger(max_bytes=1)
    call(ledger, "r-held", rng)  # over the bound from here on
    await asyncio.wait_for(ledger.room_for("r-held", wait_s=5), 1)  # a rollout it holds goes on
    with pytest.raises(ApiError) as refused:
        await ledger.room_for("r-new", wait_s=0.05)
    assert refused.value.code == ErrorCode.NOT_READY and "ledger.max_bytes" in refused.value.message
    waiting = asyncio.create_task(ledger.room_for("r-new", wait_s=30))
    await asyncio.sleep(0.05)
    assert not waiting.done() and ledger.counts()["ledger_waiting"] == 1
    frozen = ledger.freeze("r-held")
    assert ledger.drop("r-held", frozen.snapshot_id, frozen.version)  # the trainer's acknowledgement frees room
    await asyncio.wait_for(waiting, 2)
    assert ledger.held == 0 and ledger.counts()["ledger_waited"] == 2
