"""Deletion and pruning over the store's reads, on the in-memory backend: the order that keeps a restore from
finding a half-deleted checkpoint, what is kept for others, and what prune leaves alone.

The race with a checkpoint being written, on ``file://`` and SeaweedFS, is
``tests/services/coordination/test_deletion_in_flight.py``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.support.records import publish_alone

from gym_services.control import layout
from gym_services.control.models import StatusResponse
from gym_services.control.packs import PackWriter, PersistResult
from gym_services.control.participant import Capture, Record
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CheckpointMode, Phase, Role, VerifyMode
from gym_services.control.retention import CheckpointInFlight, Retention, restoring
from gym_services.control.storage import MemoryStorage, StorageError
from gym_services.control.store import CheckpointStore

RECORDS = [Record(f"session-{i}", f"state {i}".encode() * 10, f"r{i}", 0) for i in range(6)]


class Recording(MemoryStorage):
    """Memory that notes every removal, and refuses the ``fail_at``-th one (a deletion interrupted half-way)."""

    def __init__(self) -> None:
        super().__init__("recording")
        self.removed: list[str] = []
        self.fail_at: int | None = None

    def delete(self, key: str) -> None:
        if self.fail_at is not None and len(self.removed) == self.fail_at:
            self.fail_at = None
            raise StorageError("storage went away")
        self.removed.append(key)
        super().delete(key)


@pytest.fixture
def storage() -> Recording:
    return Recording()


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def checkpoint(store: CheckpointStore, pool, cid: str, records=RECORDS, reuse=(), publish=True) -> PersistResult:
    """Claimed, written by a participant, and (unless not ``publish``) published, as the coordinator does."""
    store.claim(cid, f"tx-{cid}", "test", ["p1"])
    writer = PackWriter(
        participant_id="p1",
        server="counter",
        role=Role.RESOURCES,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
        pool=pool,
        pack_bytes=256,
    )
    written = writer.write(store, Capture(records), cid, [r.index for r in reuse])
    if publish:
        publish_alone(store, cid, written, "p1", Role.RESOURCES)
    return written


def test_deletion_removes_the_global_manifest_first_and_the_tombstone_last(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    checkpoint(store, pool, "ck")
    everything = Retention(store).objects("ck")
    deleted = Retention(store).delete("ck", by="test")
    assert deleted.published and deleted.objects == len(everything)  # the tombstone it wrote and removed is not counted
    assert storage.removed[0] == layout.global_manifest_key("ck")
    assert storage.removed[1] == layout.participant_manifest_key("ck", "p1")
    assert storage.removed[-2:] == [layout.claim_key("ck"), layout.tombstone_key("ck")]
    assert storage.list("checkpoints") == [] and Retention(store).delete("ck").objects == 0


def test_an_interrupted_deletion_is_finished_by_running_it_again(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    checkpoint(store, pool, "ck")
    storage.fail_at = 2
    with pytest.raises(StorageError):
        Retention(store).delete("ck")
    state = store.state("ck")
    assert not state.published and state.tombstone is not None  # no restore finds it, no transaction claims it
    assert Retention(store).delete("ck").objects > 0 and storage.list("checkpoints") == []


def test_what_a_published_checkpoint_reuses_is_kept_until_nobody_reads_it(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    first = checkpoint(store, pool, "ck-1")
    second = checkpoint(store, pool, "ck-2", records=[*RECORDS[:5], Record("session-5", b"changed")], reuse=[first])
    assert second.reused > 0 and second.references == ["ck-1"]
    retention = Retention(store)
    kept = retention.kept_for_others("ck-1")
    assert kept and all(layout.checkpoint_of(k) == "ck-1" and readers == ["ck-2"] for k, readers in kept.items())
    assert set(kept) <= retention.objects_read_by("ck-2")
    deleted = retention.delete("ck-1")
    assert deleted.published and deleted.kept == len(kept) + 2  # and the claim and tombstone: the id stays taken
    assert set(retention.objects("ck-1")) == set(kept) | {layout.claim_key("ck-1"), layout.tombstone_key("ck-1")}
    assert retention.prune() == []  # ck-2 still reads them
    retention.delete("ck-2")
    assert [d.checkpoint_id for d in retention.prune()] == ["ck-1"] and storage.list("checkpoints") == []


def test_an_in_flight_checkpoint_is_refused_and_what_it_will_reuse_is_kept(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    first = checkpoint(store, pool, "ck-1")
    checkpoint(store, pool, "writing", reuse=[first], publish=False)
    retention = Retention(store)
    with pytest.raises(CheckpointInFlight, match="is being written"):
        retention.delete("writing")
    (intent,) = store.reuse_intents("writing")
    assert set(intent.packs) <= set(retention.kept_objects("ck-1"))  # named by its intent, not yet by a manifest
    assert retention.delete("ck-1").kept
    later = time.time() + 2 * CHECKPOINT_IN_FLIGHT_S  # "writing" never published: abandoned, nothing kept for it
    assert {d.checkpoint_id for d in retention.prune(now=later)} == {"writing", "ck-1"}
    assert storage.list("checkpoints") == []


def test_an_abandoned_checkpoint_is_deleted_at_once_by_whoever_knows_it_is_over(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    checkpoint(store, pool, "cancelled", publish=False)
    storage.removed.clear()
    deleted = Retention(store).delete("cancelled", abandoned=True, by="Checkpoint ns/x")
    assert not deleted.published and storage.list("checkpoints") == []
    assert storage.removed[-1] == layout.tombstone_key("cancelled")


def test_prune_leaves_published_and_in_flight_checkpoints_alone(storage: Recording, pool) -> None:
    store = CheckpointStore(storage)
    checkpoint(store, pool, "done")
    checkpoint(store, pool, "writing", publish=False)
    checkpoint(store, pool, "failed", publish=False)
    store.record_failure("failed", "tx-failed", "persist failed", "coordinator")
    storage.put("checkpoints/unclaimed/participants/p/packs/00000.pack", b"left by a version without claims")
    assert {d.checkpoint_id for d in Retention(store).prune()} == {"failed", "unclaimed"}
    assert store.checkpoint_ids() == ["done", "writing"]


def status(phase: Phase, checkpoint_id: str) -> StatusResponse:
    return StatusResponse(
        participant_id="x",
        server="counter",
        role=Role.RESOURCES,
        checkpoint_mode=CheckpointMode.EXPORTED,
        checkpoint_verify=VerifyMode.WAIT,
        phase=phase,
        checkpoint_id=checkpoint_id,
        lease_remaining_s=None,
        admission_open=False,
        inflight=0,
        live={},
        blockers=[],
    )


def test_a_checkpoint_being_restored_is_named_by_who_restores_it() -> None:
    statuses: dict[str, object] = {
        "a": status(Phase.RESTORED, "ck"),
        "b": status(Phase.OPEN, "ck"),
        "c": status(Phase.RESTORING, "other"),
        "d": status(Phase.RESTORING, "ck"),
        "e": RuntimeError("unreachable"),
    }
    assert restoring(statuses, "ck") == ["a", "d"]
