"""Reading a participant's records back, verified, from either version of its manifest.

Version 2 (gzip, packed records) is what :mod:`gym_services.control.packs` writes; version 1 (plain JSON,
one object per record) is what the ``commit`` verb of earlier releases wrote: no longer written, still
restored. The control plane reads at restore (:mod:`gym_services.control.plane`); the store
(:mod:`gym_services.control.store`) parses manifests with :func:`parse_participant_manifest` to verify
what ``persist`` reported and to tell what a checkpoint reads.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gym_services.control.models import SCHEMA_VERSION, PackedManifest, ParticipantManifest, RecordEntry
from gym_services.control.packs import ReuseIndex, is_packed, parse_packed_manifest, read_packed, sha256_hex
from gym_services.control.participant import InvalidState, RestoredRecord
from gym_services.control.storage import NotFound

if TYPE_CHECKING:
    from gym_services.control.store import CheckpointStore


class IncompleteCheckpoint(LookupError):
    """A manifest that should be there is not: the checkpoint was never completed."""


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


async def _run_all(pool: ThreadPoolExecutor, calls) -> list:
    loop = asyncio.get_running_loop()
    return await asyncio.gather(*(loop.run_in_executor(pool, fn, *args) for fn, *args in calls))


def parse_participant_manifest(data: bytes) -> ParticipantManifest | PackedManifest:
    """Either version: a packed manifest (gzip), or a plain one (version 1, read only)."""
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
            f"participant manifest schema_version {raw.get('schema_version')!r} is not supported "
            f"(want {SCHEMA_VERSION})"
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


async def read_participant_records(
    store: CheckpointStore,
    pool: ThreadPoolExecutor,
    manifest_key: str,
    manifest_sha256: str | None = None,
) -> ReadBack:
    """The manifest and every record, each verified against its digest and size, with the reuse index of a
    packed checkpoint."""
    loop = asyncio.get_running_loop()
    try:
        data = await loop.run_in_executor(pool, store.get, manifest_key)
    except NotFound:
        raise IncompleteCheckpoint(f"participant manifest {store.url}/{manifest_key} is missing") from None
    if manifest_sha256 is not None and sha256_hex(data) != manifest_sha256:
        raise InvalidState(f"participant manifest {manifest_key} does not match its digest in the checkpoint manifest")
    manifest = parse_participant_manifest(data)
    if isinstance(manifest, PackedManifest):
        records, reuse = await read_packed(store, pool, manifest)
        return ReadBack(manifest, records, reuse)

    def fetch(entry: RecordEntry) -> RestoredRecord:
        try:
            blob = store.get(store.v1_record_key(manifest_key, entry.key))
        except NotFound:
            raise InvalidState(f"record {entry.key} listed in the manifest is missing") from None
        if len(blob) != entry.size or sha256_hex(blob) != entry.sha256:
            raise InvalidState(f"record {entry.key} is corrupt: digest or size does not match the manifest")
        return RestoredRecord(entry.key, blob, entry.rollout_id, entry.attempt)

    records = await _run_all(pool, [(fetch, e) for e in manifest.records])
    return ReadBack(manifest, records, None)
