"""Packed, incremental checkpoints: a participant's records in a few large objects, written after resume.

The ``snapshot`` method (``docs/protocol.md``, "Records and manifests"). The control plane
(:mod:`gym_services.control.plane`) runs :func:`persist` in a worker thread once the stack has
resumed; it

1. has the participant's :class:`~gym_services.control.participant.RecordEncoder` (given to the writer
   at construction) make the bytes of every frozen record of a
   :class:`~gym_services.control.participant.Capture`, and takes every record's digest;
2. references a record whose bytes an earlier checkpoint of this participant already holds (the
   newest published one of its :class:`ReuseIndex` es, by content digest) instead of writing it again, as long as that
   checkpoint is published and the pack holding it stays mostly referenced (:data:`MIN_LIVE_SHARE`); the packs it
   will reference are named in a reuse intent first, so no deletion removes them meanwhile;
3. lays the other records end to end in packs of about ``pack_bytes``, uploads them concurrently
   and verifies each is stored whole (its size, one metadata request), as well as every pack it reuses;
4. writes the participant manifest last (gzip-compressed JSON, records indexed by columns).

:func:`read_packed` (restore) fetches every pack a manifest lists concurrently and checks each
against its digest and size before any record is sliced out of it.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import ValidationError

from gym_services.control.encoding import encode_frozen
from gym_services.control.models import (
    PACKED_SCHEMA_VERSION,
    RECORD_KEY_PATTERN,
    SCHEMA_VERSION,
    CheckpointMode,
    PackedManifest,
    PackedRecords,
    PackEntry,
    ReuseIntent,
    Role,
    VerifyMode,
)
from gym_services.control.participant import (
    ENCODES_NOTHING,
    Capture,
    FrozenRecord,
    InvalidState,
    Record,
    RecordEncoder,
    RestoredRecord,
)
from gym_services.control.storage import NotFound, StorageError

if TYPE_CHECKING:
    from gym_services.control.store import CheckpointStore

#: a pack is about this big (the server's ``checkpoint.pack_bytes`` overrides it)
DEFAULT_PACK_BYTES = 8 * 1024 * 1024
#: an earlier pack is reused only while at least this share of its bytes is still referenced; below
#: it, its live records are written again, so a chain of incremental checkpoints never keeps more
#: than about twice the bytes it needs alive
MIN_LIVE_SHARE = 0.5
GZIP_MAGIC = b"\x1f\x8b"
_KEY = re.compile(RECORD_KEY_PATTERN)
#: the state of a participant's frozen records (its encoder's input)
F = TypeVar("F")


class PersistCancelled(Exception):
    """The checkpoint was aborted (or the server is stopping) while its records were being written."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Located:
    """Where one record's bytes are: a range of a verified pack."""

    pack: PackEntry
    offset: int
    size: int


@dataclass(frozen=True)
class ReuseIndex:
    """Every record one checkpoint of this participant holds, by the digest of its bytes.

    Built by :func:`persist` (and by a restore from a packed manifest), so the next checkpoint
    can reference what did not change. Only ever used once that checkpoint is published.
    """

    checkpoint_id: str
    by_digest: dict[str, Located]


@dataclass
class PersistProgress:
    """Counters :func:`persist` keeps up to date for the ``status`` verb (read from another thread)."""

    encoded: int = 0
    objects: int = 0
    written_bytes: int = 0
    reused: int = 0


@dataclass(frozen=True)
class PersistResult:
    """What :func:`persist` wrote and verified."""

    manifest_key: str
    manifest_data: bytes
    records: int
    bytes: int  # the records' bytes, reused ones included
    objects: int  # objects written, the manifest included
    written_bytes: int
    reused: int
    references: list[str]
    episodes: list[str]
    index: ReuseIndex
    timings: dict[str, float] = field(default_factory=dict)


def _encode(
    encoder: RecordEncoder[F], capture: Capture[F], cancel: threading.Event, progress: PersistProgress
) -> list[tuple[Record, str]]:
    """Every record's bytes and digest; ``encoder`` makes the bytes of the capture's frozen records here (in a
    forked child when there are many: :mod:`gym_services.control.encoding`), then sees each in this process."""
    out: list[tuple[Record, str]] = []
    seen: set[str] = set()
    made = iter(encode_frozen(encoder, [r for r in capture.records if isinstance(r, FrozenRecord)], cancel))
    for i, item in enumerate(capture.records):
        if i % 64 == 0 and cancel.is_set():
            raise PersistCancelled("cancelled while encoding")
        if not _KEY.match(item.key):
            raise ValueError(f"invalid record key {item.key!r}")
        if item.key in seen:
            raise ValueError(f"duplicate record key {item.key!r}")
        seen.add(item.key)
        if isinstance(item, FrozenRecord):
            record = Record(item.key, next(made), item.rollout_id, item.attempt)
            encoder.encoded(item.state, record.data)
        else:
            record = item
        out.append((record, sha256_hex(record.data)))
        progress.encoded = i + 1
    return out


def _claim_reuse(
    store: CheckpointStore,
    encoded: list[tuple[Record, str]],
    candidates: Sequence[ReuseIndex],
    checkpoint_id: str,
    participant_id: str,
    progress: PersistProgress,
) -> dict[str, Located]:
    """What this checkpoint references instead of writing again: from the newest index whose checkpoint
    is published (an unpublished one's objects may be deleted any time).

    The packs it will reference are named in a :class:`~gym_services.control.models.ReuseIntent` *before*
    the earlier checkpoint is checked to be published. Deletion removes a checkpoint's global manifest
    before it reads intents (:mod:`gym_services.control.store`), so either this check sees the
    manifest gone (nothing is reused) or that deletion sees this intent (the packs are kept).
    """
    for reuse in candidates:
        if not reuse.by_digest:
            continue
        reused = _reusable(encoded, reuse)
        if not reused:
            return {}
        intent = ReuseIntent(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            participant_id=participant_id,
            created_at=time.time(),
            packs=sorted({where.pack.key for where in reused.values()}),
        )
        size = store.put_reuse_intent(intent)
        progress.objects += 1  # written by this checkpoint: counted with its packs and manifest
        progress.written_bytes += size
        if store.is_published(reuse.checkpoint_id):
            return reused
    return {}


def _reusable(encoded: list[tuple[Record, str]], reuse: ReuseIndex | None) -> dict[str, Located]:
    """digest -> where it is, for records whose earlier pack is still referenced enough to keep."""
    if reuse is None:
        return {}
    live: dict[str, int] = {}
    hits: dict[str, Located] = {}
    for record, digest in encoded:
        found = reuse.by_digest.get(digest)
        if found is not None and found.size == len(record.data) and digest not in hits:
            hits[digest] = found
            live[found.pack.key] = live.get(found.pack.key, 0) + found.size
    return {
        digest: where
        for digest, where in hits.items()
        if live[where.pack.key] >= MIN_LIVE_SHARE * max(1, where.pack.size)
    }


def persist(
    store: CheckpointStore,
    pool: ThreadPoolExecutor,
    capture: Capture[F],
    *,
    checkpoint_id: str,
    participant_id: str,
    server: str,
    role: Role,
    mode: CheckpointMode,
    verify: VerifyMode,
    pack_bytes: int = DEFAULT_PACK_BYTES,
    encoder: RecordEncoder[F] = ENCODES_NOTHING,
    reuse: Sequence[ReuseIndex] = (),
    cancel: threading.Event | None = None,
    progress: PersistProgress | None = None,
    meta: dict | None = None,
) -> PersistResult:
    """Encode, pack, upload, verify, then write the participant manifest; blocks (run it in a thread).

    Raises :class:`PersistCancelled`, :class:`~gym_services.control.storage.StorageError`, or
    :class:`~gym_services.control.participant.InvalidState` (a record that cannot be encoded); the
    manifest is then not written, so nothing can publish this checkpoint.
    """
    cancel = cancel or threading.Event()
    progress = progress or PersistProgress()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    encoded = _encode(encoder, capture, cancel, progress)
    timings["encode"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    reused = _claim_reuse(store, encoded, reuse, checkpoint_id, participant_id, progress)
    packs: list[PackEntry] = []
    pack_of: dict[str, int] = {}  # pack key -> position in ``packs``
    columns: dict[str, list] = {k: [] for k in ("keys", "rollout_ids", "attempts", "packs", "offsets", "sizes")}
    by_digest: dict[str, Located] = {}
    uploads: list[tuple[PackEntry, Future]] = []
    buffer = bytearray()
    pending: list[tuple[int, Record, str]] = []  # records of the pack being filled, with their offsets

    def place(record: Record, digest: str, where: Located) -> None:
        position = pack_of.get(where.pack.key)
        if position is None:
            position = pack_of[where.pack.key] = len(packs)
            packs.append(where.pack)
        columns["keys"].append(record.key)
        columns["rollout_ids"].append(record.rollout_id)
        columns["attempts"].append(record.attempt)
        columns["packs"].append(position)
        columns["offsets"].append(where.offset)
        columns["sizes"].append(where.size)
        by_digest.setdefault(digest, where)

    def flush() -> None:
        if not pending:
            return
        if cancel.is_set():
            raise PersistCancelled("cancelled while uploading")
        data = bytes(buffer)
        entry = PackEntry(
            key=store.pack_key(checkpoint_id, participant_id, len(uploads)), sha256=sha256_hex(data), size=len(data)
        )
        uploads.append((entry, pool.submit(store.put_pack, entry.key, data)))
        for offset, record, digest in pending:
            place(record, digest, Located(entry, offset, len(record.data)))
        buffer.clear()
        pending.clear()

    reused_count = 0
    for record, digest in encoded:
        where = reused.get(digest)
        if where is not None:
            place(record, digest, where)
            reused_count += 1
            continue
        pending.append((len(buffer), record, digest))
        buffer += record.data
        if len(buffer) >= pack_bytes:
            flush()
    flush()
    progress.reused = reused_count
    for entry, upload in uploads:
        _wait(upload, cancel)
        progress.objects += 1
        progress.written_bytes += entry.size
    timings["upload"] = time.perf_counter() - t0

    # verified: every pack this manifest lists is stored whole, the reused ones included
    t0 = time.perf_counter()
    checks = [(p, pool.submit(store.stored_size, p.key)) for p in packs]
    for pack, check in checks:
        stored = _wait(check, cancel)
        if stored != pack.size:
            what = "missing" if stored is None else f"{stored} bytes, not {pack.size}"
            raise StorageError(f"pack {store.url}/{pack.key} is {what} after writing it")
    timings["verify"] = time.perf_counter() - t0

    references = sorted({c for p in packs if (c := store.checkpoint_of(p.key)) and c != checkpoint_id})
    manifest = PackedManifest(
        schema_version=PACKED_SCHEMA_VERSION,
        checkpoint_id=checkpoint_id,
        participant_id=participant_id,
        server=server,
        role=role,
        checkpoint_mode=mode,
        checkpoint_verify=verify,
        created_at=time.time(),
        packs=packs,
        records=PackedRecords(**columns),
        reuses=references,
        meta=meta or {},
    )
    data = gzip.compress(manifest.model_dump_json().encode(), compresslevel=6, mtime=0)
    if cancel.is_set():
        raise PersistCancelled("cancelled before the manifest was written")
    key = store.put_participant_manifest(checkpoint_id, participant_id, data)
    progress.objects += 1
    progress.written_bytes += len(data)
    return PersistResult(
        manifest_key=key,
        manifest_data=data,
        records=len(encoded),
        bytes=sum(len(r.data) for r, _ in encoded),
        objects=progress.objects,
        written_bytes=progress.written_bytes,
        reused=reused_count,
        references=references,
        episodes=sorted({r.rollout_id for r, _ in encoded if r.rollout_id}),
        index=ReuseIndex(checkpoint_id, by_digest),
        timings=timings,
    )


@dataclass(frozen=True)
class PackWriter(Generic[F]):
    """Who writes a participant's checkpoints and how, with the participant's encoder: built once by the
    control plane, handed to its background uploads (:mod:`.persists`), which call :meth:`write` with what
    was captured."""

    participant_id: str
    server: str
    role: Role
    mode: CheckpointMode
    verify: VerifyMode
    pool: ThreadPoolExecutor
    encoder: RecordEncoder[F]
    pack_bytes: int = DEFAULT_PACK_BYTES

    def write(
        self,
        store: CheckpointStore,
        capture: Capture[F],
        checkpoint_id: str,
        reuse: Sequence[ReuseIndex],
        cancel: threading.Event,
        progress: PersistProgress,
    ) -> PersistResult:
        """:func:`persist` of one capture; blocks (run it in a thread)."""
        return persist(
            store,
            self.pool,
            capture,
            checkpoint_id=checkpoint_id,
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            mode=self.mode,
            verify=self.verify,
            pack_bytes=self.pack_bytes,
            encoder=self.encoder,
            reuse=reuse,
            cancel=cancel,
            progress=progress,
        )


def _wait(future: Future, cancel: threading.Event):
    while True:
        try:
            return future.result(timeout=0.25)
        except TimeoutError:
            if cancel.is_set():
                future.cancel()
                raise PersistCancelled("cancelled while uploading") from None


# --- reading ----------------------------------------------------------------------------


def is_packed(data: bytes) -> bool:
    return data[:2] == GZIP_MAGIC


def parse_packed_manifest(data: bytes) -> PackedManifest:
    try:
        raw = json.loads(gzip.decompress(data))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"packed participant manifest is not gzip-compressed JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != PACKED_SCHEMA_VERSION:
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        raise InvalidState(f"packed participant manifest schema_version {version!r} is not supported")
    try:
        return PackedManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"packed participant manifest is malformed: {exc.errors(include_url=False)[:3]}") from None


def _fetch_pack(store: CheckpointStore, pack: PackEntry) -> bytes:
    try:
        blob = store.get(pack.key)
    except NotFound:
        raise InvalidState(f"pack {pack.key} listed in the manifest is missing") from None
    if len(blob) != pack.size or sha256_hex(blob) != pack.sha256:
        raise InvalidState(f"pack {pack.key} is corrupt: digest or size does not match the manifest")
    return blob


async def read_packed(
    store: CheckpointStore, pool: ThreadPoolExecutor, manifest: PackedManifest
) -> tuple[list[RestoredRecord], ReuseIndex]:
    """Every record of a packed manifest, its packs fetched concurrently and each verified whole.

    Returns the records and the index a later checkpoint may reuse them from.
    """
    loop = asyncio.get_running_loop()
    blobs = await asyncio.gather(*(loop.run_in_executor(pool, _fetch_pack, store, p) for p in manifest.packs))
    return await loop.run_in_executor(pool, _slice, manifest, blobs)


def _slice(manifest: PackedManifest, blobs: list[bytes]) -> tuple[list[RestoredRecord], ReuseIndex]:
    cols = manifest.records
    views = [memoryview(b) for b in blobs]
    records: list[RestoredRecord] = []
    by_digest: dict[str, Located] = {}
    for key, rollout, attempt, pack, offset, size in zip(
        cols.keys, cols.rollout_ids, cols.attempts, cols.packs, cols.offsets, cols.sizes, strict=True
    ):
        data = bytes(views[pack][offset : offset + size])
        records.append(RestoredRecord(key, data, rollout, attempt))
        by_digest.setdefault(sha256_hex(data), Located(manifest.packs[pack], offset, size))
    return records, ReuseIndex(manifest.checkpoint_id, by_digest)
