"""Storage against file:// and a real S3 server (SeaweedFS): same suite, both backends."""

from __future__ import annotations

import gzip
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gym_services.control import layout
from gym_services.control.packs import PersistResult, persist, sha256_hex
from gym_services.control.participant import Capture, InvalidState, Record
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.control.records import IncompleteCheckpoint, read_participant_records
from gym_services.control.storage import AlreadyExists, NotFound, StorageError, open_storage
from gym_services.control.store import CheckpointStore

V1_FIXTURE = Path(__file__).parents[2] / "fixtures" / "v1_checkpoint" / "store"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as executor:
        yield executor


def test_put_get_list_delete(storage_url: str) -> None:
    store = open_storage(storage_url)
    store.put("a/b/one.json", b"1")
    store.put("a/two.json", b"2")
    store.put("a/b/one.json", b"1b")  # plain put replaces
    assert store.get("a/b/one.json") == b"1b"
    assert store.list("a") == ["a/b/one.json", "a/two.json"]
    assert store.list_folders("a") == ["b"]
    assert store.exists("a/two.json") and not store.exists("a/three.json")
    store.delete("a/two.json")
    store.delete("a/two.json")  # missing is fine
    with pytest.raises(NotFound):
        store.get("a/two.json")


def test_conditional_put_never_overwrites(storage_url: str) -> None:
    store = open_storage(storage_url)
    store.put_if_absent("checkpoints/c1/manifest.json", b"first")
    with pytest.raises(AlreadyExists):
        store.put_if_absent("checkpoints/c1/manifest.json", b"second")
    assert store.get("checkpoints/c1/manifest.json") == b"first"


def test_bad_keys_and_locations_are_refused(tmp_path) -> None:
    store = open_storage(f"file://{tmp_path}")
    for key in ("../etc/passwd", "/abs", "a//b", ""):
        with pytest.raises(StorageError):
            store.put(key, b"x")
    for url in ("http://x/y", "file://host/path", "s3://", "relative/path"):
        with pytest.raises(StorageError):
            open_storage(url)


def _write(store: CheckpointStore, pool, records: list[Record]) -> PersistResult:
    return persist(
        store,
        pool,
        Capture(records),
        checkpoint_id="c1",
        participant_id="p1",
        server="counter",
        role=Role.RESOURCES,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
    )


async def test_records_then_manifest_round_trip(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    records = [Record("session-a", b'{"v":1}', "r1", 0), Record("session-b", b'{"v":2}')]
    written = _write(store, pool, records)
    assert written.manifest_key == layout.participant_manifest_key("c1", "p1")
    read = await read_participant_records(store, pool, written.manifest_key, sha256_hex(written.manifest_data))
    assert [(r.key, r.data, r.rollout_id, r.new_attempt) for r in read.records] == [
        ("session-a", b'{"v":1}', "r1", 1),
        ("session-b", b'{"v":2}', None, None),
    ]
    assert read.manifest.records.keys == ["session-a", "session-b"]


async def test_corrupt_pack_is_refused_by_digest(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    written = _write(store, pool, [Record("session-a", b'{"v":1}')])
    store.storage.put(layout.pack_key("c1", "p1", 0), b'{"v":9}')
    with pytest.raises(InvalidState, match="corrupt"):
        await read_participant_records(store, pool, written.manifest_key)


async def test_a_v1_record_is_verified_by_its_digest(tmp_path, pool) -> None:
    """Version 1 manifests (one object per record, written by releases before the packed format) are read and
    verified the same way; tests/fixtures/v1_checkpoint holds one written by that code."""
    shutil.copytree(V1_FIXTURE, tmp_path / "store")
    store = CheckpointStore(open_storage(f"file://{tmp_path / 'store'}"))
    key = layout.participant_manifest_key("v1-ck", "counter")
    read = await read_participant_records(store, pool, key)
    assert sorted(r.rollout_id for r in read.records) == ["r1", "r2"] and read.reuse is None
    record = next(k for k in store.objects("v1-ck") if "/records/" in k)
    store.storage.put(record, store.get(record).replace(b"1", b"2"))
    with pytest.raises(InvalidState, match="corrupt"):
        await read_participant_records(store, pool, key)


async def test_manifest_digest_mismatch_is_refused(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    written = _write(store, pool, [Record("session-a", b"{}")])
    with pytest.raises(InvalidState, match="digest"):
        await read_participant_records(store, pool, written.manifest_key, "0" * 64)


async def test_missing_manifest_means_incomplete(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    store.put_pack(layout.pack_key("c1", "p1", 0), b"{}")  # a pack without a manifest
    with pytest.raises(IncompleteCheckpoint):
        await read_participant_records(store, pool, layout.participant_manifest_key("c1", "p1"))


async def test_published_checkpoint_manifests_are_final(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    _write(store, pool, [Record("session-a", b"{}")])
    _write(store, pool, [Record("session-a", b"{}")])  # retried persist before publish: fine
    store.storage.put_if_absent(layout.global_manifest_key("c1"), b"{}")
    with pytest.raises(AlreadyExists):
        _write(store, pool, [Record("session-a", b'{"changed":1}')])


async def test_wrong_schema_version_is_refused(storage_url: str, pool) -> None:
    store = CheckpointStore(open_storage(storage_url))
    written = _write(store, pool, [])
    raw = gzip.decompress(written.manifest_data).replace(b'"schema_version":2', b'"schema_version":99')
    store.storage.put(written.manifest_key, gzip.compress(raw))
    with pytest.raises(InvalidState, match="schema_version"):
        await read_participant_records(store, pool, written.manifest_key)
