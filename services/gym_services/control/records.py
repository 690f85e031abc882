"""Writing a participant's records then its manifest, and reading them back verified.

The control plane writes at commit (the ``sync`` method: one object per record) and reads at
restore (:mod:`gym_services.control.plane`); packed manifests of the ``snapshot`` method are written
by :mod:`gym_services.control.packs` and read here too. The coordinator checks what commit or
persist reported with :func:`parse_participant_manifest` before it publishes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import ValidationError

from gym_services.control import layout
from gym_services.control.models import (
    RECORD_KEY_PATTERN,
    SCHEMA_VERSION,
    CheckpointMode,
    PackedManifest,
    ParticipantManifest,
    RecordEntry,
    Role,
    VerifyMode,
)
from gym_services.control.packs import ReuseIndex, is_packed, parse_packed_manifest, put_manifest, read_packed
from gym_services.control.participant import InvalidState, Record, RestoredRecord
from gym_services.control.storage import NotFound, Storage

_RECORD_KEY = re.compile(RECORD_KEY_PATTERN)


class IncompleteCheckpoint(LookupError):
    """A manifest that should be there is not: the checkpoint was never completed."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


async def _run_all(pool: ThreadPoolExecutor, calls) -> list:
    loop = asyncio.get_running_loop()
    return await asyncio.gather(*(loop.run_in_executor(pool, fn, *args) for fn, *args in calls))


async def write_participant_checkpoint(
    storage: Storage,
    pool: ThreadPoolExecutor,
    *,
    checkpoint_id: str,
    participant_id: str,
    server: str,
    role: Role,
    mode: CheckpointMode,
    verify: VerifyMode,
    records: list[Record],
    meta: dict | None = None,
) -> tuple[str, bytes]:
    """Records first, then the manifest listing their digests; returns (manifest key, manifest bytes)."""
    seen: set[str] = set()
    entries: list[RecordEntry] = []
    for record in records:
        if not _RECORD_KEY.match(record.key):
            raise ValueError(f"invalid record key {record.key!r}")
        if record.key in seen:
            raise ValueError(f"duplicate record key {record.key!r}")
        seen.add(record.key)
        entries.append(
            RecordEntry(
                key=record.key,
                sha256=sha256(record.data),
                size=len(record.data),
                rollout_id=record.rollout_id,
                attempt=record.attempt,
            )
        )
    await _run_all(
        pool,
        [(storage.put, layout.record_key(checkpoint_id, participant_id, r.key), r.data) for r in records],
    )
    manifest = ParticipantManifest(
        schema_version=SCHEMA_VERSION,
        checkpoint_id=checkpoint_id,
        participant_id=participant_id,
        server=server,
        role=role,
        checkpoint_mode=mode,
        checkpoint_verify=verify,
        created_at=time.time(),
        records=entries,
        meta=meta or {},
    )
    data = manifest.model_dump_json(indent=1).encode()
    key = layout.participant_manifest_key(checkpoint_id, participant_id)
    # a retried commit of the same checkpoint may replace the manifest only while it is unpublished
    await asyncio.get_running_loop().run_in_executor(pool, put_manifest, storage, checkpoint_id, key, data)
    return key, data


def parse_participant_manifest(data: bytes) -> ParticipantManifest | PackedManifest:
    """Either version: a packed manifest (gzip) of the ``snapshot`` method, or a plain one of ``sync``."""
    if is_packed(data):
        return parse_packed_manifest(data)
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"participant manifest is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidState("participant manifest must be a JSON object")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidState(
            f"participant manifest schema_version {raw.get('schema_version')!r} is not supported (want {SCHEMA_VERSION})"
        )
    try:
        return ParticipantManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"participant manifest is malformed: {exc.errors(include_url=False)[:3]}") from None


def manifest_records(manifest: ParticipantManifest | PackedManifest) -> int:
    """How many records a participant manifest lists."""
    return len(manifest.records.keys) if isinstance(manifest, PackedManifest) else len(manifest.records)


@dataclass(frozen=True)
class ReadBack:
    """A participant's checkpoint read back and verified, and what a later checkpoint may reuse of it."""

    manifest: ParticipantManifest | PackedManifest
    records: list[RestoredRecord]
    reuse: ReuseIndex | None


async def read_participant_checkpoint(
    storage: Storage,
    pool: ThreadPoolExecutor,
    manifest_key: str,
    manifest_sha256: str | None = None,
) -> tuple[ParticipantManifest | PackedManifest, list[RestoredRecord]]:
    """The manifest and every record, each verified against its digest and size."""
    read = await read_participant_records(storage, pool, manifest_key, manifest_sha256)
    return read.manifest, read.records


async def read_participant_records(
    storage: Storage,
    pool: ThreadPoolExecutor,
    manifest_key: str,
    manifest_sha256: str | None = None,
) -> ReadBack:
    """Like :func:`read_participant_checkpoint`, with the reuse index of a packed checkpoint."""
    loop = asyncio.get_running_loop()
    try:
        data = await loop.run_in_executor(pool, storage.get, manifest_key)
    except NotFound:
        raise IncompleteCheckpoint(f"participant manifest {storage.url}/{manifest_key} is missing") from None
    if manifest_sha256 is not None and sha256(data) != manifest_sha256:
        raise InvalidState(f"participant manifest {manifest_key} does not match its digest in the checkpoint manifest")
    manifest = parse_participant_manifest(data)
    if isinstance(manifest, PackedManifest):
        records, reuse = await read_packed(storage, pool, manifest)
        return ReadBack(manifest, records, reuse)
    prefix = manifest_key.rsplit("/", 1)[0]

    def fetch(entry: RecordEntry) -> RestoredRecord:
        key = f"{prefix}/records/{entry.key}"
        try:
            blob = storage.get(key)
        except NotFound:
            raise InvalidState(f"record {entry.key} listed in the manifest is missing") from None
        if len(blob) != entry.size or sha256(blob) != entry.sha256:
            raise InvalidState(f"record {entry.key} is corrupt: digest or size does not match the manifest")
        return RestoredRecord(entry.key, blob, entry.rollout_id, entry.attempt)

    records = await _run_all(pool, [(fetch, e) for e in manifest.records])
    return ReadBack(manifest, records, None)
