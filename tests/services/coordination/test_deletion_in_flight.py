"""Deletion never removes what a checkpoint still being written will read; abandoned checkpoints are pruned.

Real packs written by :class:`gym_services.control.packs.PackWriter` on ``file://`` and SeaweedFS through the
:class:`~gym_services.control.store.CheckpointStore`, deleted and pruned by
:class:`~gym_services.control.retention.Retention`; the global manifests and claims are written the way the
coordinator writes them. The race is made deterministic by
running the deletion from inside the in-flight checkpoint's own upload (its first pack verification).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gym_services.control import layout
from gym_services.control.manifests import parse_participant_manifest
from gym_services.control.models import SCHEMA_VERSION, CheckpointClaim, GlobalManifest, ManifestParticipant, Tombstone
from gym_services.control.packs import PackWriter, read_packed
from gym_services.control.participant import Capture, Record
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CLOCK_SKEW_S, CheckpointMode, Role, VerifyMode
from gym_services.control.retention import CheckpointInFlight, Retention
from gym_services.control.storage import Storage, StorageError, open_storage
from gym_services.control.store import CheckpointRefused, CheckpointStore

PID = "workplace"


def records(changed: set[int] = frozenset(), n: int = 40) -> list[Record]:
    return [
        Record(f"session-{i:03d}", (f"state of {i}" + (" changed" if i in changed else "")).encode() * 50, f"r{i}", 0)
        for i in range(n)
    ]


def claim(storage: Storage, cid: str, created_at: float | None = None) -> None:
    body = CheckpointClaim(
        schema_version=SCHEMA_VERSION,
        checkpoint_id=cid,
        transaction_id=f"tx-{cid}",
        claimed_by="test",
        created_at=time.time() if created_at is None else created_at,
        participants=[PID],
    )
    storage.put_if_absent(layout.claim_key(cid), body.model_dump_json().encode())


def write(storage: Storage, pool: ThreadPoolExecutor, cid: str, recs: list[Record], reuse=()):
    writer = PackWriter(
        participant_id=PID,
        server="workplace_assistant",
        role=Role.RESOURCES,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
        pool=pool,
        pack_bytes=1024,
    )
    return writer.write(CheckpointStore(storage), Capture(recs), cid, [w.index for w in reuse])


def publish(storage: Storage, cid: str, written) -> None:
    manifest = GlobalManifest(
        schema_version=SCHEMA_VERSION,
        checkpoint_id=cid,
        transaction_id=f"tx-{cid}",
        created_at=time.time(),
        participants=[
            ManifestParticipant(
                participant_id=PID,
                role=Role.RESOURCES,
                manifest_key=written.manifest.key,
                manifest_sha256=written.manifest.sha256,
                manifest_size=written.manifest.size,
                records=written.records,
                bytes=written.bytes,
            )
        ],
        references=written.references,
    )
    storage.put_if_absent(layout.global_manifest_key(cid), manifest.model_dump_json().encode())


def retention(storage: Storage) -> Retention:
    return Retention(CheckpointStore(storage))


class DeleteDuring:
    """The location the in-flight checkpoint writes to; its first pack verification runs ``during`` first."""

    def __init__(self, storage: Storage, during) -> None:
        self._storage, self._during, self.ran = storage, during, None
        self.url = storage.url
        self._once = threading.Lock()  # verifications run concurrently in the pool

    def size(self, key: str):
        with self._once:
            if self.ran is None:
                self.ran = self._during()
        return self._storage.size(key)

    def __getattr__(self, name):
        return getattr(self._storage, name)


def restored(storage: Storage, pool: ThreadPoolExecutor, written) -> dict[str, bytes]:
    manifest = parse_participant_manifest(storage.get(written.manifest.key))
    got, _ = asyncio.run(read_packed(CheckpointStore(storage), pool, manifest))
    return {r.key: r.data for r in got}


def test_deleting_the_checkpoint_an_in_flight_one_reuses_keeps_its_packs(storage_url) -> None:
    storage = open_storage(storage_url)
    with ThreadPoolExecutor(4) as pool:
        claim(storage, "ck-a")
        first = write(storage, pool, "ck-a", records())
        publish(storage, "ck-a", first)
        claim(storage, "ck-b")
        # ck-b reuses ck-a's packs; ck-a is deleted after ck-b chose them, before ck-b is verified or published
        hooked = DeleteDuring(storage, lambda: retention(storage).delete("ck-a"))
        second = write(hooked, pool, "ck-b", records(changed={3}), reuse=[first])
        assert hooked.ran is not None and hooked.ran.published and hooked.ran.kept
        assert second.reused == 39 and second.references == ["ck-a"]
        publish(storage, "ck-b", second)
        assert restored(storage, pool, second) == {r.key: r.data for r in records(changed={3})}
        left = set(retention(storage).objects("ck-a"))
        assert layout.global_manifest_key("ck-a") not in left
        assert {layout.claim_key("ck-a"), layout.tombstone_key("ck-a")} <= left  # the id stays taken
        # once ck-b is deleted too, nothing reads ck-a's leftovers: prune removes them, and ck-b's
        assert retention(storage).delete("ck-b").published
        assert retention(storage).delete("ck-b").objects == 0
        assert [d.checkpoint_id for d in retention(storage).prune()] == ["ck-a"]
        assert retention(storage).objects("ck-a") == retention(storage).objects("ck-b") == []


def test_an_in_flight_checkpoint_is_not_deleted_and_an_abandoned_one_is_pruned(storage_url) -> None:
    storage = open_storage(storage_url)
    with ThreadPoolExecutor(4) as pool:
        claim(storage, "done")
        publish(storage, "done", done := write(storage, pool, "done", records()))
        claim(storage, "writing")
        write(storage, pool, "writing", records(), reuse=[done])  # written, not (yet) published
        claim(storage, "crashed", created_at=time.time() - 3600)
        write(storage, pool, "crashed", records(changed={1}))
        storage.put("checkpoints/unclaimed/participants/p/packs/00000.pack", b"left by a version without claims")
        in_flight = set(retention(storage).objects("writing"))

        with pytest.raises(CheckpointInFlight, match="is being written"):
            retention(storage).delete("writing")
        assert set(retention(storage).objects("writing")) == in_flight
        assert {d.checkpoint_id for d in retention(storage).prune()} == {
            "unclaimed"
        }  # crashed is still within its bound
        # deleting what "writing" reuses keeps those packs while it is in flight
        assert retention(storage).delete("done").kept

        later = time.time() + CHECKPOINT_IN_FLIGHT_S + CLOCK_SKEW_S + 1
        assert {d.checkpoint_id for d in retention(storage).prune(now=later)} == {"crashed", "writing", "done"}
        assert storage.list("checkpoints/") == []

        claim(storage, "cancelled")
        write(storage, pool, "cancelled", records())
        deleted = retention(storage).delete("cancelled", abandoned=True, by="Checkpoint x")
        assert not deleted.published and storage.list("checkpoints/") == []


def test_a_deleted_or_expired_id_is_never_claimed_or_published_again(storage_url) -> None:
    storage = open_storage(storage_url)
    store = CheckpointStore(storage)
    claim(storage, "old", created_at=time.time() - CHECKPOINT_IN_FLIGHT_S - 1)
    with pytest.raises(CheckpointRefused, match="never published: it is abandoned"):
        store.claim("old", "tx-old", "test", [])
    claim(storage, "gone")
    tombstone = Tombstone(schema_version=SCHEMA_VERSION, checkpoint_id="gone", reason="deleted", created_at=0)
    storage.put(layout.tombstone_key("gone"), tombstone.model_dump_json().encode())  # deleted, objects kept
    # no transaction may claim it again, its own neither
    with pytest.raises(CheckpointRefused, match="was deleted, failed or abandoned"):
        store.claim("gone", "tx-gone", "test", [])
    published, publish_by = store.claim("new", "tx-new", "test", [])
    assert published is None and publish_by == pytest.approx(time.time() + CHECKPOINT_IN_FLIGHT_S, abs=5)
    manifest = GlobalManifest(
        schema_version=SCHEMA_VERSION, checkpoint_id="new", transaction_id="tx-new", created_at=0, participants=[]
    )
    with pytest.raises(CheckpointRefused, match="was not published within"):
        store.publish(manifest, publish_by=time.time() - 1)
    assert not storage.exists(layout.global_manifest_key("new"))
    with pytest.raises(CheckpointRefused, match="deleted or failed while it was written"):
        store.publish(manifest.model_copy(update={"checkpoint_id": "gone", "transaction_id": "tx-gone"}))
    assert not storage.exists(layout.global_manifest_key("gone"))


def test_a_storage_refusing_the_intent_fails_the_upload_before_anything_is_reused(tmp_path) -> None:
    storage = open_storage(f"file://{tmp_path}")
    with ThreadPoolExecutor(2) as pool:
        claim(storage, "ck-a")
        publish(storage, "ck-a", first := write(storage, pool, "ck-a", records()))

        class Refusing(DeleteDuring):
            def put(self, key, data):
                if key.endswith("/reuses.json"):
                    raise StorageError("refused")
                return self._storage.put(key, data)

        with pytest.raises(StorageError, match="refused"):
            write(Refusing(storage, lambda: None), pool, "ck-b", records(), reuse=[first])
        assert not storage.exists(layout.participant_manifest_key("ck-b", PID))
