"""Packed, incremental checkpoints: a participant's records in a few large objects, written after resume.

The packed format (``docs/protocol.md``, "Records and manifests"). The control plane
(:mod:`gym_services.control.plane`) builds one :class:`PackWriter` with the participant's
:class:`~gym_services.control.participant.RecordEncoder`; its background uploads (:mod:`.persists`) call
:meth:`PackWriter.write` in a worker thread once the stack has resumed, which

1. has the encoder make the bytes of every frozen record of a :class:`~gym_services.control.participant.Capture`
   (:mod:`.encoding`), and takes every record's digest;
2. references a record whose bytes an earlier checkpoint of this participant already holds (the
   newest published one of its :class:`ReuseIndex` es, by content digest) instead of writing it again, as long as that
   checkpoint is published and the pack holding it stays mostly referenced (:data:`MIN_LIVE_SHARE`); the packs it
   will reference are named in a reuse intent first, so no deletion removes them meanwhile;
3. lays the other records end to end in packs of about ``pack_bytes`` (:class:`_Packing`), uploads them
   concurrently through the store and verifies each is stored whole (its size, one metadata request), as well as
   every pack it reuses. A record an earlier checkpoint held but whose pack is no longer referenced enough goes into
   packs of its own, apart from the new ones: what outlived one checkpoint tends to outlive the next (a token ledger's
   chunks), what is new is often gone by then (a cut generation's prompt), so once rewritten beside each other
   the lasting records fill packs that the next checkpoints reference whole;
4. has the store write the participant manifest last (gzip-compressed JSON, records indexed by columns).

:func:`read_packed` (restore) fetches every pack a manifest lists concurrently, each checked by the store
against its digest and size before any record is sliced out of it.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gym_services.control.encoding import PersistCancelled, encode_frozen
from gym_services.control.manifests import references, sha256_hex
from gym_services.control.models import (
    PACKED_SCHEMA_VERSION,
    RECORD_KEY_PATTERN,
    CheckpointMode,
    PackedManifest,
    PackedRecords,
    PackEntry,
    Role,
    VerifyMode,
)
from gym_services.control.participant import (
    ENCODES_NOTHING,
    Capture,
    FrozenRecord,
    Record,
    RecordEncoder,
    RestoredRecord,
)
from gym_services.control.storage import StorageError
from gym_services.control.store import CheckpointStore, StoredManifest

#: a pack is about this big (the server's ``checkpoint.pack_bytes`` overrides it)
DEFAULT_PACK_BYTES = 8 * 1024 * 1024
#: an earlier pack is reused only while at least this share of its bytes is still referenced; below
#: it, its live records are written again, so a chain of incremental checkpoints never keeps more
#: than about twice the bytes it needs alive
MIN_LIVE_SHARE = 0.5
_KEY = re.compile(RECORD_KEY_PATTERN)
#: the state of a participant's frozen records (its encoder's input)
F = TypeVar("F")
T = TypeVar("T")
#: how long waiting for an upload waits before it checks for cancel again
POLL_S = 0.25


@dataclass(frozen=True)
class Located:
    """Where one record's bytes are: a range of a verified pack."""

    pack: PackEntry
    offset: int
    size: int


@dataclass(frozen=True)
class ReuseIndex:
    """Every record one checkpoint of this participant holds, by the digest of its bytes.

    Built by :meth:`PackWriter.write` (and by a restore from a packed manifest), so the next checkpoint
    can reference what did not change. Only ever used once that checkpoint is published.
    """

    checkpoint_id: str
    by_digest: dict[str, Located]


@dataclass
class PersistProgress:
    """Counters :meth:`PackWriter.write` keeps up to date for the ``status`` verb (read from another thread)."""

    encoded: int = 0
    objects: int = 0
    written_bytes: int = 0
    reused: int = 0


@dataclass(frozen=True)
class PersistResult:
    """What :meth:`PackWriter.write` wrote and verified."""

    manifest: StoredManifest
    records: int
    bytes: int  # the records' bytes, reused ones included
    objects: int  # objects written, the manifest included
    written_bytes: int
    reused: int
    references: list[str]
    episodes: list[str]
    index: ReuseIndex
    timings: dict[str, float] = field(default_factory=dict)


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
    encoder: RecordEncoder[F] = ENCODES_NOTHING
    pack_bytes: int = DEFAULT_PACK_BYTES

    def write(
        self,
        store: CheckpointStore,
        capture: Capture[F],
        checkpoint_id: str,
        reuse: Sequence[ReuseIndex] = (),
        cancel: threading.Event | None = None,
        progress: PersistProgress | None = None,
    ) -> PersistResult:
        """Encode, pack, upload, verify, then write the participant manifest; blocks (run it in a thread).

        Raises :class:`~gym_services.control.encoding.PersistCancelled`,
        :class:`~gym_services.control.storage.StorageError`, or
        :class:`~gym_services.control.participant.InvalidState` (a record that cannot be encoded); the
        manifest is then not written, so nothing can publish this checkpoint.
        """
        cancel = cancel or threading.Event()
        progress = progress or PersistProgress()
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        encoded = _encode(self.encoder, capture, cancel, progress)
        timings["encode"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        reused = self._claim_reuse(store, encoded, reuse, checkpoint_id, progress)
        packing = _Packing(store, self.pool, checkpoint_id, self.participant_id, self.pack_bytes, cancel)
        held = set().union(*(index.by_digest for index in reuse))
        for record, digest in encoded:
            packing.add(record, digest, reused.get(digest), carried=digest in held)
        packs = packing.finish(progress)
        timings["upload"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self._verify(store, packs, cancel)
        timings["verify"] = time.perf_counter() - t0

        manifest = self._manifest(checkpoint_id, packs, packing.columns)
        if cancel.is_set():
            raise PersistCancelled("cancelled before the manifest was written")
        stored = store.write_participant_manifest(manifest)
        progress.objects += 1
        progress.written_bytes += stored.size
        return PersistResult(
            manifest=stored,
            records=len(encoded),
            bytes=sum(len(r.data) for r, _ in encoded),
            objects=progress.objects,
            written_bytes=progress.written_bytes,
            reused=packing.reused,
            references=manifest.reuses,
            episodes=sorted({r.rollout_id for r, _ in encoded if r.rollout_id}),
            index=ReuseIndex(checkpoint_id, packing.index(packs)),
            timings=timings,
        )

    def _claim_reuse(
        self,
        store: CheckpointStore,
        encoded: list[tuple[Record, str]],
        candidates: Sequence[ReuseIndex],
        checkpoint_id: str,
        progress: PersistProgress,
    ) -> dict[str, Located]:
        """What this checkpoint references instead of writing again: from the newest index whose checkpoint
        is published (an unpublished one's objects may be deleted any time).

        The packs it will reference are named in a :class:`~gym_services.control.models.ReuseIntent` *before*
        the earlier checkpoint is checked to be published. Deletion removes a checkpoint's global manifest
        before it reads intents (:mod:`gym_services.control.retention`), so either this check sees the
        manifest gone (nothing is reused) or that deletion sees this intent (the packs are kept).
        """
        for reuse in candidates:
            if not reuse.by_digest:
                continue
            reused = _reusable(encoded, reuse)
            if not reused:
                return {}
            size = store.put_reuse_intent(checkpoint_id, self.participant_id, (w.pack for w in reused.values()))
            progress.objects += 1  # written by this checkpoint: counted with its packs and manifest
            progress.written_bytes += size
            if store.is_published(reuse.checkpoint_id):
                return reused
        return {}

    def _verify(self, store: CheckpointStore, packs: list[PackEntry], cancel: threading.Event) -> None:
        """Every pack the manifest lists is stored whole, the reused ones included."""
        checks = [(p, self.pool.submit(store.pack_size, p)) for p in packs]
        for pack, check in checks:
            stored = _wait(check, cancel)
            if stored != pack.size:
                what = "missing" if stored is None else f"{stored} bytes, not {pack.size}"
                raise StorageError(f"pack {store.url}/{pack.key} is {what} after writing it")

    def _manifest(self, checkpoint_id: str, packs: list[PackEntry], columns: dict[str, list[Any]]) -> PackedManifest:
        return PackedManifest(
            schema_version=PACKED_SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            checkpoint_mode=self.mode,
            checkpoint_verify=self.verify,
            created_at=time.time(),
            packs=packs,
            records=PackedRecords(**columns),
            reuses=references(packs, checkpoint_id),
        )


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


@dataclass
class _Filling:
    """A pack being filled: its bytes so far, and its records with their offsets."""

    buffer: bytearray = field(default_factory=bytearray)
    pending: list[tuple[int, Record, str]] = field(default_factory=list)


class _Packing:
    """One checkpoint's records laid out in packs: each new pack uploaded as soon as it fills, reused records
    referenced where they are. Records are indexed by columns in capture order (:class:`PackedRecords`); a record's
    pack is a slot of the manifest's ``packs``: an earlier checkpoint's pack, or an upload that returns its entry."""

    def __init__(
        self,
        store: CheckpointStore,
        pool: ThreadPoolExecutor,
        checkpoint_id: str,
        participant_id: str,
        pack_bytes: int,
        cancel: threading.Event,
    ) -> None:
        self.store, self.pool, self.cancel = store, pool, cancel
        self.checkpoint_id, self.participant_id, self.pack_bytes = checkpoint_id, participant_id, pack_bytes
        self.slots: list[PackEntry | Future[PackEntry]] = []
        self.slot_of: dict[str, int] = {}  # reused pack key -> its slot
        self.uploads: list[tuple[Future[PackEntry], int]] = []  # with the pack's size
        self.columns: dict[str, list[Any]] = {
            k: [] for k in ("keys", "rollout_ids", "attempts", "packs", "offsets", "sizes")
        }
        self.placed: list[tuple[str, int, int, int]] = []  # digest, slot, offset, size: the reuse index, once known
        #: the packs being filled: of records an earlier checkpoint held (True), of new ones (False)
        self.filling = {True: _Filling(), False: _Filling()}
        self.reused = 0

    def add(self, record: Record, digest: str, where: Located | None, carried: bool = False) -> None:
        """Reference the record where an earlier pack holds it, or add it to the pack being filled for its kind
        (``carried``: an earlier checkpoint held it)."""
        if where is not None:
            slot = self.slot_of.get(where.pack.key)
            if slot is None:
                slot = self.slot_of[where.pack.key] = len(self.slots)
                self.slots.append(where.pack)
            self._place(record, digest, slot, where.offset)
            self.reused += 1
            return
        filling = self.filling[carried]
        filling.pending.append((len(filling.buffer), record, digest))
        filling.buffer += record.data
        if len(filling.buffer) >= self.pack_bytes:
            self._flush(filling)

    def _place(self, record: Record, digest: str, slot: int, offset: int) -> None:
        for column, value in (
            ("keys", record.key),
            ("rollout_ids", record.rollout_id),
            ("attempts", record.attempt),
            ("packs", slot),
            ("offsets", offset),
            ("sizes", len(record.data)),
        ):
            self.columns[column].append(value)
        self.placed.append((digest, slot, offset, len(record.data)))

    def _flush(self, filling: _Filling) -> None:
        if not filling.pending:
            return
        if self.cancel.is_set():
            raise PersistCancelled("cancelled while uploading")
        data = bytes(filling.buffer)
        upload = self.pool.submit(
            self.store.write_pack, self.checkpoint_id, self.participant_id, len(self.uploads), data
        )
        slot = len(self.slots)
        self.slots.append(upload)
        self.uploads.append((upload, len(data)))
        for offset, record, digest in filling.pending:
            self._place(record, digest, slot, offset)
        filling.buffer.clear()
        filling.pending.clear()

    def finish(self, progress: PersistProgress) -> list[PackEntry]:
        """The last packs flushed and every upload awaited: the manifest's packs, in slot order."""
        for filling in self.filling.values():
            self._flush(filling)
        progress.reused = self.reused
        for upload, size in self.uploads:
            _wait(upload, self.cancel)
            progress.objects += 1
            progress.written_bytes += size
        return [s if isinstance(s, PackEntry) else s.result() for s in self.slots]

    def index(self, packs: list[PackEntry]) -> dict[str, Located]:
        """digest -> where its bytes are, for the next checkpoint to reuse (the first record of each digest)."""
        by_digest: dict[str, Located] = {}
        for digest, slot, offset, size in self.placed:
            if digest not in by_digest:
                by_digest[digest] = Located(packs[slot], offset, size)
        return by_digest


def _wait(future: Future[T], cancel: threading.Event) -> T:
    while True:
        try:
            return future.result(timeout=POLL_S)
        except TimeoutError:
            if cancel.is_set():
                future.cancel()
                raise PersistCancelled("cancelled while uploading") from None


# --- reading ----------------------------------------------------------------------------


async def read_packed(
    store: CheckpointStore, pool: ThreadPoolExecutor, manifest: PackedManifest
) -> tuple[list[RestoredRecord], ReuseIndex]:
    """Every record of a packed manifest, its packs fetched concurrently and each verified whole.

    Returns the records and the index a later checkpoint may reuse them from.
    """
    loop = asyncio.get_running_loop()
    blobs = await asyncio.gather(*(loop.run_in_executor(pool, store.read_pack, p) for p in manifest.packs))
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
