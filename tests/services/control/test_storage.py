"""Storage against file:// and a real S3 server (SeaweedFS): same suite, both backends."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gym_services.control import layout
from gym_services.control.participant import InvalidState, Record
from gym_services.control.records import (
    IncompleteCheckpoint,
    read_participant_checkpoint,
    sha256,
    write_participant_checkpoint,
)
from gym_services.control.storage import AlreadyExists, NotFound, StorageError, open_storage


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


async def _write(store, pool, records):
    return await write_participant_checkpoint(
        store, pool, checkpoint_id="c1", participant_id="p1", server="counter", role="resources",
        mode="exported", verify="wait", records=records,
    )


async def test_records_then_manifest_round_trip(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    records = [Record("session-a", b'{"v":1}', "r1", 0), Record("session-b", b'{"v":2}')]
    key, data = await _write(store, pool, records)
    assert key == layout.participant_manifest_key("c1", "p1")
    manifest, restored = await read_participant_checkpoint(store, pool, key, sha256(data))
    assert [(r.key, r.data, r.rollout_id, r.new_attempt) for r in restored] == [
        ("session-a", b'{"v":1}', "r1", 1),
        ("session-b", b'{"v":2}', None, None),
    ]
    assert manifest.records[0].sha256 == sha256(b'{"v":1}')


async def test_corrupt_record_is_refused_by_digest(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    key, _ = await _write(store, pool, [Record("session-a", b'{"v":1}')])
    store.put(layout.record_key("c1", "p1", "session-a"), b'{"v":9}')
    with pytest.raises(InvalidState, match="corrupt"):
        await read_participant_checkpoint(store, pool, key)


async def test_manifest_digest_mismatch_is_refused(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    key, _ = await _write(store, pool, [Record("session-a", b"{}")])
    with pytest.raises(InvalidState, match="digest"):
        await read_participant_checkpoint(store, pool, key, "0" * 64)


async def test_missing_manifest_means_incomplete(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    store.put(layout.record_key("c1", "p1", "session-a"), b"{}")  # records without a manifest
    with pytest.raises(IncompleteCheckpoint):
        await read_participant_checkpoint(store, pool, layout.participant_manifest_key("c1", "p1"))


async def test_published_checkpoint_manifests_are_final(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    await _write(store, pool, [Record("session-a", b"{}")])
    await _write(store, pool, [Record("session-a", b"{}")])  # retried commit before publish: fine
    store.put_if_absent(layout.global_manifest_key("c1"), b"{}")
    with pytest.raises(AlreadyExists):
        await _write(store, pool, [Record("session-a", b'{"changed":1}')])


async def test_wrong_schema_version_is_refused(storage_url: str, pool) -> None:
    store = open_storage(storage_url)
    key, data = await _write(store, pool, [])
    store.put(key, data.replace(b'"schema_version": 1', b'"schema_version": 99'))
    with pytest.raises(InvalidState, match="schema_version"):
        await read_participant_checkpoint(store, pool, key)
