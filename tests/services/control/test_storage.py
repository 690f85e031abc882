"""Storage against file://, a real S3 server (SeaweedFS) and memory: same contract, every backend; packs written
and read back through the store."""

from __future__ import annotations

import gzip
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gym_services.control import layout
from gym_services.control.packs import PackWriter, PersistResult
from gym_services.control.participant import Capture, InvalidState, Record
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.control.records import IncompleteCheckpoint, read_participant_records
from gym_services.control.retention import Retention
from gym_services.control.storage import AlreadyExists, MemoryStorage, NotFound, Storage, StorageError, open_storage
from gym_services.control.store import CheckpointStore

V1_FIXTURE = Path(__file__).parents[2] / "fixtures" / "v1_checkpoint" / "store"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as executor:
        yield executor


def put_get_list_delete(store: Storage) -> None:
    store.put("a/b/one.json", b"1")
    store.put("a/two.json", b"2")
    store.put("a/b/one.json", b"1b")  # plain put replaces
    assert store.get("a/b/one.json") == b"1b"
    assert store.list("a") == store.list("a/") == ["a/b/one.json", "a/two.json"]
    assert store.list("a/b") == ["a/b/one.json"] and store.list("a/b/one") == [] and store.list("nothing") == []
    assert store.list_folders("a") == ["b"]
    assert store.exists("a/two.json") and not store.exists("a/three.json") and not store.exists("a/b")
    assert store.size("a/b/one.json") == 2 and store.size("a/three.json") is None
    store.delete("a/two.json")
    store.delete("a/two.json")  # missing is fine
    with pytest.raises(NotFound):
        store.get("a/two.json")
    with pytest.raises(NotFound):
        store.get("a/b")  # a folder is not an object


def conditional_put_never_overwrites(store: Storage) -> None:
    store.put_if_absent("checkpoints/c1/manifest.json", b"first")
    with pytest.raises(AlreadyExists):
        store.put_if_absent("checkpoints/c1/manifest.json", b"second")
    assert store.get("checkpoints/c1/manifest.json") == b"first"


def bad_keys_are_refused(store: Storage) -> None:
    for key in ("../etc/passwd", "/abs", "a//b", ""):
        with pytest.raises(StorageError):
            store.put(key, b"x")


def test_the_storage_contract_on_every_location(storage_url: str) -> None:
    for check in (put_get_list_delete, conditional_put_never_overwrites, bad_keys_are_refused):
        check(open_storage(storage_url))


def test_the_storage_contract_in_memory() -> None:
    for check in (put_get_list_delete, conditional_put_never_overwrites, bad_keys_are_refused):
        check(MemoryStorage())


def test_one_conditional_put_wins_among_threads_in_memory() -> None:
    storage, won, barrier = MemoryStorage(), [], threading.Barrier(8)

    def race(n: int) -> None:
        barrier.wait()
        try:
            storage.put_if_absent("checkpoints/c1/claim.json", str(n).encode())
            won.append(n)
        except AlreadyExists:
            pass

    threads = [threading.Thread(target=race, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(won) == 1 and storage.get("checkpoints/c1/claim.json") == str(won[0]).encode()


def test_bad_locations_are_refused() -> None:
    for url in ("http://x/y", "file://host/path", "s3://", "relative/path", "memory://x"):
        with pytest.raises(StorageError):
            open_storage(url)


def _write(store: CheckpointStore, pool, records: list[Record]) -> PersistResult:
    writer = PackWriter(
        participant_id="p1",
        server="counter",
        role=Role.RESOURCES,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
        pool=pool,
    )
    return writer.write(store, Capture(records), "c1")


async def test_records_then_manifest_round_trip(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    records = [Record("session-a", b'{"v":1}', "r1", 0), Record("session-b", b'{"v":2}')]
    written = _write(store, pool, records)
    assert written.manifest.key == layout.participant_manifest_key("c1", "p1")
    read = await read_participant_records(store, pool, "c1", written.manifest.key, written.manifest.sha256)
    assert [(r.key, r.data, r.rollout_id, r.new_attempt) for r in read.records] == [
        ("session-a", b'{"v":1}', "r1", 1),
        ("session-b", b'{"v":2}', None, None),
    ]
    assert read.manifest.records.keys == ["session-a", "session-b"]


async def test_corrupt_pack_is_refused_by_digest(pool) -> None:
    store = CheckpointStore(MemoryStorage())
    written = _write(store, pool, [Record("session-a", b'{"v":1}')])
    store.storage.put(layout.pack_key("c1", "p1", 0), b'{"v":9}')
    with pytest.raises(InvalidState, match="corrupt"):
        await read_participant_records(store, pool, "c1", written.manifest.key)
    store.storage.delete(layout.pack_key("c1", "p1", 0))
    with pytest.raises(InvalidState, match="missing"):
        await read_participant_records(store, pool, "c1", written.manifest.key)


async def test_a_v1_record_is_verified_by_its_digest(tmp_path, pool) -> None:
    """Version 1 manifests (one object per record, written by releases before the packed format) are read and
    verified the same way; tests/fixtures/v1_checkpoint holds one written by that code."""
    shutil.copytree(V1_FIXTURE, tmp_path / "store")
    storage = open_storage(f"file://{tmp_path / 'store'}")
    store = CheckpointStore(storage)
    key = layout.participant_manifest_key("v1-ck", "counter")
    read = await read_participant_records(store, pool, "v1-ck", key)
    assert sorted(r.rollout_id for r in read.records) == ["r1", "r2"] and read.reuse is None
    record = next(k for k in Retention(store).objects("v1-ck") if "/records/" in k)
    storage.put(record, storage.get(record).replace(b"1", b"2"))
    with pytest.raises(InvalidState, match="corrupt"):
        await read_participant_records(store, pool, "v1-ck", key)


async def test_manifest_digest_mismatch_is_refused(pool) -> None:
    store = CheckpointStore(MemoryStorage())
    written = _write(store, pool, [Record("session-a", b"{}")])
    with pytest.raises(InvalidState, match="digest"):
        await read_participant_records(store, pool, "c1", written.manifest.key, "0" * 64)


async def test_only_a_participant_manifest_of_the_checkpoint_is_read(pool) -> None:
    """A restore names its participant manifest by the key the global manifest holds: any other object (a pack,
    another checkpoint's manifest, a path outside ``checkpoints/``) is refused before it is read."""
    store = CheckpointStore(MemoryStorage())
    written = _write(store, pool, [Record("session-a", b"{}")])
    for cid, key in (
        ("c2", written.manifest.key),
        ("c1", layout.pack_key("c1", "p1", 0)),
        ("c1", "../c1/participants/p1/manifest.json"),
        ("c1", layout.global_manifest_key("c1")),
    ):
        with pytest.raises(InvalidState, match="is not a participant manifest"):
            await read_participant_records(store, pool, cid, key)


async def test_missing_manifest_means_incomplete(pool) -> None:
    store = CheckpointStore(MemoryStorage())
    store.write_pack("c1", "p1", 0, b"{}")  # a pack without a manifest
    with pytest.raises(IncompleteCheckpoint):
        await read_participant_records(store, pool, "c1", layout.participant_manifest_key("c1", "p1"))


async def test_published_checkpoint_manifests_are_final(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    _write(store, pool, [Record("session-a", b"{}")])
    _write(store, pool, [Record("session-a", b"{}")])  # retried persist before publish: fine
    store.storage.put_if_absent(layout.global_manifest_key("c1"), b"{}")
    with pytest.raises(AlreadyExists):
        _write(store, pool, [Record("session-a", b'{"changed":1}')])


async def test_wrong_schema_version_is_refused(pool) -> None:
    store = CheckpointStore(MemoryStorage())
    written = _write(store, pool, [])
    raw = gzip.decompress(store.storage.get(written.manifest.key))
    store.storage.put(written.manifest.key, gzip.compress(raw.replace(b'"schema_version":2', b'"schema_version":99')))
    with pytest.raises(InvalidState, match="schema_version"):
        await read_participant_records(store, pool, "c1", written.manifest.key)
