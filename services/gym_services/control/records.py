"""Reading a participant's records back, verified, from either version of its manifest.

Version 2 (gzip, packed records) is what :mod:`gym_services.control.packs` writes; version 1 (plain JSON,
one object per record) is what the ``commit`` verb of earlier releases wrote: no longer written, still
restored. The control plane reads at restore (:mod:`gym_services.control.plane`), through the store's read verbs
(:class:`~gym_services.control.store.CheckpointStore`), which check every object against its digest.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gym_services.control.models import PackedManifest, ParticipantManifest, RecordEntry
from gym_services.control.packs import ReuseIndex, read_packed
from gym_services.control.participant import RestoredRecord
from gym_services.control.storage import NotFound
from gym_services.control.store import CheckpointStore


class IncompleteCheckpoint(LookupError):
    """A manifest that should be there is not: the checkpoint was never completed."""


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class ReadBack:
    """A participant's checkpoint read back and verified, and what a later checkpoint may reuse of it."""

    manifest: ParticipantManifest | PackedManifest
    records: list[RestoredRecord]
    reuse: ReuseIndex | None


async def read_participant_records(
    store: CheckpointStore,
    pool: ThreadPoolExecutor,
    checkpoint_id: str,
    manifest_key: str,
    manifest_sha256: str | None = None,
) -> ReadBack:
    """The manifest a global manifest of ``checkpoint_id`` names and every record, each verified against its digest
    and size, with the reuse index of a packed checkpoint."""
    loop = asyncio.get_running_loop()
    try:
        manifest = await loop.run_in_executor(
            pool, store.read_participant_manifest, checkpoint_id, manifest_key, manifest_sha256
        )
    except NotFound:
        raise IncompleteCheckpoint(f"participant manifest {store.url}/{manifest_key} is missing") from None
    if isinstance(manifest, PackedManifest):
        records, reuse = await read_packed(store, pool, manifest)
        return ReadBack(manifest, records, reuse)
    v1 = manifest

    def fetch(entry: RecordEntry) -> RestoredRecord:
        return RestoredRecord(entry.key, store.read_record(v1, entry), entry.rollout_id, entry.attempt)

    records = await asyncio.gather(*(loop.run_in_executor(pool, fetch, e) for e in v1.records))
    return ReadBack(manifest, list(records), None)
