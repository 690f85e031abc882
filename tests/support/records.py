"""Read and tamper with the records of a stored participant checkpoint (packed manifests), for tests that
check what a restore refuses: a record that fails validation with consistent digests, or a corrupt pack."""

from __future__ import annotations

import gzip
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gym_services.control import layout
from gym_services.control.manifests import parse_packed_manifest
from gym_services.control.models import SCHEMA_VERSION, GlobalManifest, ManifestParticipant, PackedManifest, PackEntry
from gym_services.control.packs import DEFAULT_PACK_BYTES, PackWriter, PersistResult
from gym_services.control.participant import RecordEncoder, RestoredRecord
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.control.storage import Storage, open_storage
from gym_services.control.store import CheckpointStore


def _manifest(storage: Storage, manifest_key: str) -> PackedManifest:
    return parse_packed_manifest(storage.get(manifest_key))


def records(location: str | Storage, manifest_key: str) -> dict[str, bytes]:
    """Record key -> its stored bytes, in manifest order."""
    storage = open_storage(location) if isinstance(location, str) else location
    manifest = _manifest(storage, manifest_key)
    cols = manifest.records
    blobs = {p.key: storage.get(p.key) for p in manifest.packs}
    return {
        key: blobs[manifest.packs[pack].key][offset : offset + size]
        for key, pack, offset, size in zip(cols.keys, cols.packs, cols.offsets, cols.sizes, strict=True)
    }


def restored_records(location: str | Storage, manifest_key: str) -> list[RestoredRecord]:
    """The records as a restore hands them to its participant: bytes and manifest identity, in manifest order."""
    storage = open_storage(location) if isinstance(location, str) else location
    cols = _manifest(storage, manifest_key).records
    data = records(storage, manifest_key)
    return [
        RestoredRecord(key, data[key], rollout, attempt)
        for key, rollout, attempt in zip(cols.keys, cols.rollout_ids, cols.attempts, strict=True)
    ]


def rewrite_record(location: str | Storage, manifest_key: str, key: str, change: Callable[[bytes], bytes]) -> None:
    """Store ``change(record)`` instead of the record, in a pack of its own, with the manifest's digests kept
    consistent: only the participant's validation can refuse it."""
    storage = open_storage(location) if isinstance(location, str) else location
    manifest = _manifest(storage, manifest_key)
    data = change(records(storage, manifest_key)[key])
    pack = PackEntry(
        key=layout.pack_key(manifest.checkpoint_id, manifest.participant_id, 90000 + len(manifest.packs)),
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
    )
    storage.put(pack.key, data)
    cols = manifest.records
    i = cols.keys.index(key)
    cols.packs[i], cols.offsets[i], cols.sizes[i] = len(manifest.packs), 0, len(data)
    manifest.packs.append(pack)
    storage.put(manifest_key, gzip.compress(manifest.model_dump_json().encode()))


def corrupt_record(location: str | Storage, manifest_key: str, key: str, change: Callable[[bytes], bytes]) -> None:
    """Change the record's bytes inside its pack (same length) without touching any digest: a corrupt pack."""
    storage = open_storage(location) if isinstance(location, str) else location
    manifest = _manifest(storage, manifest_key)
    cols = manifest.records
    i = cols.keys.index(key)
    pack = manifest.packs[cols.packs[i]]
    blob = bytearray(storage.get(pack.key))
    start, end = cols.offsets[i], cols.offsets[i] + cols.sizes[i]
    changed = change(bytes(blob[start:end]))
    assert len(changed) == end - start, "a corrupt record keeps its length"
    blob[start:end] = changed
    storage.put(pack.key, bytes(blob))


def publish_alone(
    store: CheckpointStore, checkpoint_id: str, written: PersistResult, participant_id: str, role: Role
) -> None:
    """Publish ``checkpoint_id`` as the coordinator would with one participant, the one ``written`` persisted."""
    participant = ManifestParticipant(
        participant_id=participant_id,
        role=role,
        manifest_key=written.manifest.key,
        manifest_sha256=written.manifest.sha256,
        manifest_size=written.manifest.size,
        records=written.records,
        bytes=written.bytes,
    )
    store.publish(
        GlobalManifest(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            transaction_id=f"tx-{checkpoint_id}",
            created_at=time.time(),
            participants=[participant],
            references=written.references,
        )
    )


def model_pack_writer(
    pool: ThreadPoolExecutor, encoder: RecordEncoder[Any], pack_bytes: int = DEFAULT_PACK_BYTES
) -> PackWriter[Any]:
    """The policy model participant's pack writer, as its control plane builds it, with ``encoder``."""
    return PackWriter(
        participant_id="policy-model",
        server="policy_model",
        role=Role.MODEL,
        mode=CheckpointMode.EXPORTED,
        verify=VerifyMode.WAIT,
        pool=pool,
        encoder=encoder,
        pack_bytes=pack_bytes,
    )
