"""Background uploads of captured checkpoints, and what later checkpoints may reuse.

A collaborator of the control plane (:mod:`gym_services.control.plane`), which builds it with its
:class:`~gym_services.control.packs.PackWriter` and metrics: ``resume`` after a ``capture`` queues a
:class:`PersistJob` here (or ``persist`` under the pause starts one); ``persist`` starts it and waits for
it; ``abort`` cancels it; ``status`` shows it. The job hands the capture to the writer in a worker thread
(while the server serves rollouts again, unless the ``sync`` method keeps it paused) and answers with the
participant manifest it wrote.

Writing waits for ``persist`` because the coordinator sends it only once every participant has
answered ``resume``: an upload started at this participant's own resume takes the CPU the others
need to answer theirs, and the pause is over only when the last one has (with 16 participants on
2 cores, resume took 168 ms instead of 29). A job nobody asks for within
:data:`PERSIST_START_GRACE_S` starts anyway, so a coordinator re-run after a crash finds it written.

A job that fails or is cancelled never wrote its participant manifest, so nothing can publish its
checkpoint (``docs/protocol.md``, "Transactions").
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.encoding import HeapHold, PersistCancelled
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import PersistResponse, PersistState, PersistStatus
from gym_services.control.packs import PackWriter, PersistProgress, PersistResult, ReuseIndex
from gym_services.control.participant import Capture, InvalidState
from gym_services.control.storage import StorageError
from gym_services.control.store import CheckpointStore

log = get_logger("control")
#: finished jobs remembered for repeated ``persist`` calls and ``status``
JOBS_KEPT = 4
#: a queued upload starts by itself this long after ``resume`` if ``persist`` has not started it
PERSIST_START_GRACE_S = 2.0
#: reuse indexes remembered per location, newest first (the newest published one is used)
INDEXES_KEPT = 3


#: the state of the participant's frozen records
F = TypeVar("F")


@dataclass(frozen=True)
class PendingCapture(Generic[F]):
    """A capture waiting for ``resume`` (or ``abort``) under the pause."""

    checkpoint_id: str
    store: CheckpointStore
    capture: Capture[F]
    heap: HeapHold | None = None  # the heap frozen since the capture (gc_pause.collection_paused), until released
    started: float = field(default_factory=time.monotonic)

    def release(self) -> None:
        """The capture's persist ended, or it was dropped: its hold on the frozen heap ends."""
        if self.heap is not None:
            self.heap.release()


class PersistJob:
    """One checkpoint's background upload."""

    def __init__(self, checkpoint_id: str, records: int) -> None:
        self.checkpoint_id = checkpoint_id
        self.records = records
        self.state = PersistState.QUEUED
        self.progress = PersistProgress()
        self.cancel = threading.Event()
        self.go = asyncio.Event()  # set by ``persist`` (or ``abort``): stop waiting in the queue
        self.started = time.monotonic()
        self.finished: float | None = None
        self.answer: PersistResponse | None = None
        self.error: ApiError | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.state in (PersistState.QUEUED, PersistState.PERSISTING)

    def begin(self) -> None:
        """The coordinator asked for the upload: start writing now if it is still queued."""
        self.go.set()

    def status(self) -> PersistStatus:
        end = self.finished if self.finished is not None else time.monotonic()
        return PersistStatus(
            checkpoint_id=self.checkpoint_id,
            state=self.state,
            records=self.records,
            encoded=self.progress.encoded,
            objects=self.progress.objects,
            written_bytes=self.progress.written_bytes,
            reused=self.progress.reused,
            elapsed_s=round(end - self.started, 6),
            error=self.error.message if self.error is not None else None,
        )

    async def wait(self) -> PersistResponse:
        """The verified answer once the upload is done; its error otherwise."""
        if self.task is not None:
            await asyncio.shield(self.task)
        if self.answer is not None:
            return self.answer
        assert self.error is not None
        raise self.error

    def _end(self, state: PersistState, error: ApiError | None = None) -> None:
        self.state = state
        self.error = error
        self.finished = time.monotonic()


class Persists(Generic[F]):
    """The plane's background uploads (one at a time) and its reuse indexes per location."""

    def __init__(self, writer: PackWriter[F], metrics: ControlMetrics) -> None:
        self.writer = writer
        self.metrics = metrics
        self._jobs: OrderedDict[str, PersistJob] = OrderedDict()
        self._indexes: dict[str, list[ReuseIndex]] = {}

    def get(self, checkpoint_id: str) -> PersistJob | None:
        return self._jobs.get(checkpoint_id)

    def running(self) -> PersistJob | None:
        return next((j for j in self._jobs.values() if j.running), None)

    def newest(self) -> PersistJob | None:
        return next(reversed(self._jobs.values()), None)

    def indexes(self, store: CheckpointStore) -> list[ReuseIndex]:
        return list(self._indexes.get(store.url, ()))

    def remember(self, store: CheckpointStore, index: ReuseIndex | None) -> None:
        """A checkpoint this process wrote or restored: the next one may reference its records."""
        if index is None:
            return
        kept = [i for i in self._indexes.get(store.url, []) if i.checkpoint_id != index.checkpoint_id]
        self._indexes[store.url] = [index, *kept][:INDEXES_KEPT]

    def answer(self, captured: PendingCapture[F], written: PersistResult) -> PersistResponse:
        """What ``persist`` answers once the writer wrote and verified a capture."""
        self.metrics.records_written.inc(written.records - written.reused)
        self.metrics.bytes_written.inc(written.written_bytes)
        log.info(
            "checkpoint persisted",
            extra={
                "checkpoint_id": captured.checkpoint_id,
                "records": written.records,
                "reused": written.reused,
                "objects": written.objects,
                "bytes": written.written_bytes,
            },
        )
        return PersistResponse(
            checkpoint_id=captured.checkpoint_id,
            participant_id=self.writer.participant_id,
            role=self.writer.role,
            manifest_key=written.manifest.key,
            manifest_sha256=written.manifest.sha256,
            manifest_size=written.manifest.size,
            records=written.records,
            bytes=written.bytes,
            episodes=written.episodes,
            duration_s=round(time.monotonic() - captured.started, 6),
            objects=written.objects,
            written_bytes=written.written_bytes,
            reused=written.reused,
            references=written.references,
            scope=captured.capture.scope,
        )

    def start(self, captured: PendingCapture[F]) -> PersistJob:
        """Queue the capture's upload: the writer runs in a worker thread once ``persist`` (or the grace) starts it."""
        job = PersistJob(captured.checkpoint_id, len(captured.capture))
        self._jobs[job.checkpoint_id] = job
        self._jobs.move_to_end(job.checkpoint_id)
        while len(self._jobs) > JOBS_KEPT:
            oldest = next(iter(self._jobs))
            if self._jobs[oldest].running:
                break
            del self._jobs[oldest]
        indexes = self.indexes(captured.store)

        async def run() -> None:
            cid = job.checkpoint_id
            try:
                try:
                    await asyncio.wait_for(job.go.wait(), PERSIST_START_GRACE_S)
                except TimeoutError:
                    log.info("background upload starting without persist", extra={"checkpoint_id": cid})
                if not job.running:
                    return  # cancelled while queued: it ended then
                job.state = PersistState.PERSISTING
                written = await asyncio.to_thread(
                    functools.partial(
                        self.writer.write, captured.store, captured.capture, cid, indexes, job.cancel, job.progress
                    )
                )
            except PersistCancelled as exc:
                job._end(
                    PersistState.CANCELLED,
                    ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was aborted: {exc}"),
                )
            except StorageError as exc:
                job._end(
                    PersistState.FAILED,
                    ApiError(ErrorCode.STORAGE_UNAVAILABLE, f"writing checkpoint {cid} failed: {exc}"),
                )
            except (InvalidState, ValueError, TypeError) as exc:
                job._end(
                    PersistState.FAILED, ApiError(ErrorCode.INVALID_STATE, f"checkpoint {cid} cannot be written: {exc}")
                )
            except asyncio.CancelledError:
                job.cancel.set()
                job._end(
                    PersistState.CANCELLED, ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid}: server stopping")
                )
                raise
            except Exception as exc:
                log.exception("background upload failed", extra={"checkpoint_id": cid})
                job._end(PersistState.FAILED, ApiError(ErrorCode.INTERNAL, f"writing checkpoint {cid} failed: {exc}"))
            else:
                job.answer = self.answer(captured, written)
                self.remember(captured.store, written.index)
                job._end(PersistState.PERSISTED)
            if job.error is not None:
                log.warning(job.error.message, extra={"checkpoint_id": cid, "state": job.state})

        job.task = asyncio.create_task(run(), name=f"persist-{job.checkpoint_id}")
        job.task.add_done_callback(lambda _: captured.release())  # however it ends, even cancelled before it ran
        return job

    def cancel(self, checkpoint_id: str) -> PersistJob | None:
        """Stop a running upload (its manifest is never written); the job ends ``cancelled``."""
        job = self._jobs.get(checkpoint_id)
        if job is not None and job.running:
            job.cancel.set()
            job.go.set()
            if job.state is PersistState.QUEUED:  # nothing written: over now, so the next prepare is not busy
                job._end(
                    PersistState.CANCELLED,
                    ApiError(
                        ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {checkpoint_id} was aborted before writing started"
                    ),
                )
        return job

    def cancel_all(self) -> None:
        for job in self._jobs.values():
            job.cancel.set()
            job.go.set()
            if job.task is not None and not job.task.done():
                job.task.cancel()
