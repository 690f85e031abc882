"""The store's verbs, one by one, on the in-memory backend: a claim, a verified persist, a publication, a failure,
a restore's decision, and a participant's packs, intents and manifests."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gym_services.control import layout
from gym_services.control.models import SCHEMA_VERSION, GlobalManifest, PackedManifest, PersistResponse
from gym_services.control.packs import PackWriter, PersistResult
from gym_services.control.participant import Capture, InvalidState, Record
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CheckpointMode, Decision, Role, VerifyMode
from gym_services.control.storage import AlreadyExists, MemoryStorage
from gym_services.control.store import CheckpointRefused, CheckpointStore


@pytest.fixture
def store() -> CheckpointStore:
    return CheckpointStore(MemoryStorage("store"))


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def write(store: CheckpointStore, pool, cid: str, records: list[Record], reuse=()) -> PersistResult:
    writer = PackWriter(
        participant_id="p1",
        server="counter",
        role=Role.RESOURCES,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
        pool=pool,
        pack_bytes=64,
    )
    return writer.write(store, Capture(records), cid, reuse)


def answer(cid: str, written: PersistResult, **changes) -> PersistResponse:
    fields = {
        "checkpoint_id": cid,
        "participant_id": "p1",
        "role": Role.RESOURCES,
        "manifest_key": written.manifest.key,
        "manifest_sha256": written.manifest.sha256,
        "manifest_size": written.manifest.size,
        "records": written.records,
        "bytes": written.bytes,
    }
    return PersistResponse(**(fields | changes))


def manifest(cid: str, transaction_id: str = "tx") -> GlobalManifest:
    return GlobalManifest(
        schema_version=SCHEMA_VERSION, checkpoint_id=cid, transaction_id=transaction_id, created_at=0, participants=[]
    )


RECORDS = [Record(f"session-{i}", f"state {i}".encode() * 10, f"r{i}", 0) for i in range(6)]


def test_a_claim_names_one_transaction(store: CheckpointStore) -> None:
    published, publish_by = store.claim("ck", "tx-1", "test", ["p1"])
    assert published is None and publish_by == pytest.approx(time.time() + CHECKPOINT_IN_FLIGHT_S, abs=5)
    assert store.claim("ck", "tx-1", "test", ["p1"])[1] == publish_by  # the same transaction again carries on
    with pytest.raises(CheckpointRefused, match="already names another transaction"):
        store.claim("ck", "tx-2", "test", ["p1"])
    assert store.state("ck").in_flight() and store.checkpoint_ids() == ["ck"]


def test_publishing_is_once_and_only_for_its_transaction(store: CheckpointStore) -> None:
    _, publish_by = store.claim("ck", "tx", "test", [])
    first = store.publish(manifest("ck"), publish_by)
    assert first.key == CheckpointStore.manifest_key("ck") and store.is_published("ck")
    assert store.publish(manifest("ck"), publish_by).manifest == first.manifest  # a retry whose answer was lost
    with pytest.raises(CheckpointRefused, match="published by someone else"):
        store.publish(manifest("ck", "tx-other"))
    assert store.claim("ck", "tx", "test", [])[0] == first.manifest  # a repeat of the finished transaction
    with pytest.raises(CheckpointRefused, match="already exists"):
        store.claim("ck", "tx-other", "test", [])


def test_a_failure_is_recorded_only_for_the_claimed_transaction(store: CheckpointStore) -> None:
    store.claim("ck", "tx", "test", [])
    assert not store.record_failure("ck", "tx-other", "boom", "coordinator")
    assert store.record_failure("ck", "tx", "boom", "coordinator")
    assert not store.record_failure("ck", "tx", "again", "coordinator")  # the first tombstone holds
    state = store.state("ck")
    assert state.tombstone is not None and state.tombstone.reason == "failed" and "boom" in state.tombstone.by
    assert not state.in_flight()
    with pytest.raises(CheckpointRefused, match="deleted, failed or abandoned"):
        store.claim("ck", "tx", "test", [])
    with pytest.raises(CheckpointRefused, match="deleted or failed while it was written"):
        store.publish(manifest("ck"))


def test_what_a_participant_persisted_is_verified(store: CheckpointStore, pool) -> None:
    written = write(store, pool, "ck", RECORDS)
    assert len(written.index.by_digest) == len(RECORDS) and written.objects > 2  # several packs of 64 bytes
    store.verify_persisted("ck", "p1", answer("ck", written))
    refused = {
        "not at": answer("ck", written, manifest_key=layout.participant_manifest_key("ck", "p2")),
        "does not match the digest": answer("ck", written, manifest_sha256="0" * 64),
        "lists 6 records, persist said 5": answer("ck", written, records=5),
    }
    for message, wrong in refused.items():
        with pytest.raises(CheckpointRefused, match=message):
            store.verify_persisted("ck", "p1", wrong)
    with pytest.raises(CheckpointRefused, match="not at"):
        store.verify_persisted("ck", "p2", answer("ck", written, participant_id="p2"))
    store.storage.put(layout.pack_key("ck", "p1", 1), b"short")
    with pytest.raises(CheckpointRefused, match="5 bytes, not"):
        store.verify_persisted("ck", "p1", answer("ck", written))
    store.storage.delete(layout.pack_key("ck", "p1", 1))
    with pytest.raises(CheckpointRefused, match="is missing"):
        store.verify_persisted("ck", "p1", answer("ck", written))


def test_a_reuse_is_named_in_an_intent_before_it_is_relied_on(store: CheckpointStore, pool) -> None:
    first = write(store, pool, "ck-1", RECORDS)
    assert write(store, pool, "ck-2", RECORDS, reuse=[first.index]).reused == 0  # ck-1 is not published
    assert [i.packs for i in store.reuse_intents("ck-2")] != []  # named anyway: the check comes after it
    store.publish(manifest("ck-1"))
    second = write(store, pool, "ck-3", RECORDS, reuse=[first.index])
    assert second.reused == len(RECORDS) and second.references == ["ck-1"]
    (intent,) = store.reuse_intents("ck-3")
    assert intent.participant_id == "p1" and all(layout.checkpoint_of(k) == "ck-1" for k in intent.packs)
    store.verify_persisted("ck-3", "p1", answer("ck-3", second))  # its packs are ck-1's, stored whole


def test_records_that_outlive_a_checkpoint_are_rewritten_apart_from_new_ones(store: CheckpointStore, pool) -> None:
    """A lasting record (a ledger chunk) packed beside records that are gone by the next checkpoint (cut prompts) is
    rewritten once its pack is mostly dead, into a pack of its own kind, which the checkpoints after reference."""
    lasting = [Record(f"chunk-{i}", bytes([65 + i]) * 40, "r", 0) for i in range(3)]

    def fresh(n: int) -> list[Record]:
        return [Record(f"prompt-{n}-{i}", f"{n}:{i};".encode() * 25, "r", 0) for i in range(4)]

    indexes = []
    for n in range(3):
        written = write(store, pool, f"ck-{n}", lasting + fresh(n), reuse=indexes[-1:])
        store.publish(manifest(f"ck-{n}"))
        indexes.append(written.index)
    # ck-1: chunk-2 shared its pack with a prompt of ck-0 (40 of 140 bytes live): written again, on its own
    # ck-2: every chunk is referenced; only the new prompts are written
    assert written.reused == len(lasting)
    own = {
        w.pack.key: w.pack.size for w in written.index.by_digest.values() if layout.checkpoint_of(w.pack.key) == "ck-2"
    }
    assert sum(own.values()) == sum(len(r.data) for r in fresh(2))


def test_a_restore_reads_verified_packs(store: CheckpointStore, pool) -> None:
    written = write(store, pool, "ck", RECORDS)
    read = store.read_participant_manifest("ck", written.manifest.key, written.manifest.sha256)
    assert isinstance(read, PackedManifest) and read.participant_id == "p1"
    pack = read.packs[0]
    assert store.pack_size(pack) == pack.size and store.read_pack(pack)
    store.storage.put(pack.key, b"x" * pack.size)
    with pytest.raises(InvalidState, match="corrupt"):
        store.read_pack(pack)
    store.storage.put(written.manifest.key, b"{not a manifest")
    with pytest.raises(InvalidState, match="not JSON"):
        store.read_participant_manifest("ck", written.manifest.key)


def test_manifests_of_a_published_checkpoint_are_final(store: CheckpointStore, pool) -> None:
    write(store, pool, "ck", RECORDS)
    write(store, pool, "ck", RECORDS[:2])  # a retried persist replaces it while unpublished
    store.publish(manifest("ck"))
    with pytest.raises(AlreadyExists, match="already published"):
        write(store, pool, "ck", RECORDS)


def test_one_decision_holds_per_restore(store: CheckpointStore) -> None:
    assert store.decision("ck", "rs-1") is None
    assert store.settle("ck", "rs-1", Decision.ABORT, "p1") == Decision.ABORT
    assert store.settle("ck", "rs-1", Decision.RESUME, "coordinator") == Decision.ABORT  # the first one wins
    assert store.settle("ck", "rs-2", Decision.RESUME, "coordinator") == Decision.RESUME
    store.storage.put(layout.restore_decision_key("ck", "rs-3"), b"garbage")
    with pytest.raises(InvalidState, match="malformed"):
        store.decision("ck", "rs-3")
    assert store.decisions("ck") == [
        ("rs-1", "abort", "p1"),
        ("rs-2", "resume", "coordinator"),
        ("rs-3", "unreadable", ""),
    ]
