"""Encoding a capture's frozen records in a forked child process, off the serving process's GIL.

Called by :func:`gym_services.control.packs.persist` (the background persist after ``resume``). Encoding is
pure-Python CPU work: in a thread of the serving process it holds the GIL about half the time, so every
request the server answers meanwhile waits for it, and on a 2-core machine under 8 clients' calls the persist of
1,000 Workplace sessions took 7-14 s (issue 29). A child made by ``fork`` sees the capture exactly as it was
frozen (the participant's :class:`~gym_services.control.participant.RecordEncoder` reads only what the
capture froze) and encodes it in a process of its own; the parent only reads the bytes back from a pipe (which
releases the GIL) and keeps serving.

The child runs nothing but the encoders: it never touches the event loop, storage, locks or logging, stops
cyclic garbage collection (whose passes would write to, and so copy, every page it shares with the parent),
and ends with ``os._exit``. A child that dies is reported and its records encoded in the thread instead; one
that hangs is killed when the checkpoint is cancelled (``abort``, or the server stopping).
Captures under :data:`FORK_MIN_RECORDS` frozen records are encoded in the thread (a fork costs more).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import struct
import threading
from collections.abc import Sequence
from typing import TypeVar

from gym_services.base.logs import get_logger
from gym_services.control.participant import FrozenRecord, InvalidState, RecordEncoder

log = get_logger("control")
#: the state of the frozen records one encoder takes
F = TypeVar("F")
#: fewer frozen records than this are encoded in the calling thread
FORK_MIN_RECORDS = 64
_HEADER = struct.Struct("<BQ")  # status (0: bytes follow, 1: an error message follows), length
_OK, _ERROR = 0, 1
#: how long reading the child's output waits before it checks for cancel again
POLL_S = 0.25


def encode_frozen(encoder: RecordEncoder[F], items: Sequence[FrozenRecord[F]], cancel: threading.Event) -> list[bytes]:
    """Every item's bytes made by ``encoder``, in order; :class:`InvalidState` for a record that cannot be encoded."""
    if len(items) < FORK_MIN_RECORDS or not hasattr(os, "fork"):
        return [encode_one(encoder, item) for item in items]
    try:
        return _encode_forked(encoder, items, cancel)
    except _ChildDied as exc:
        log.warning(f"encoding child failed ({exc}); encoding {len(items)} records in the thread instead")
        return [encode_one(encoder, item) for item in items]


def encode_one(encoder: RecordEncoder[F], item: FrozenRecord[F]) -> bytes:
    """One record's bytes, in this thread; any failure of the encoder is :class:`InvalidState` naming the record."""
    try:
        data = encoder.encode(item.state)
    except InvalidState:
        raise
    except Exception as exc:  # any failure of one record's encoder fails the checkpoint, named
        raise InvalidState(f"record {item.key} cannot be encoded: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, bytes):
        raise InvalidState(f"record {item.key} encoded to {type(data).__name__}, not bytes")
    return data


class _ChildDied(Exception):
    pass


def _encode_forked(encoder: RecordEncoder[F], items: Sequence[FrozenRecord[F]], cancel: threading.Event) -> list[bytes]:
    from gym_services.control.packs import PersistCancelled  # packs imports this module

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: encode, write, exit; never return into the parent's code
        status = 1
        try:
            os.close(read_fd)
            _child(encoder, items, write_fd)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    out: list[bytes] = []
    failed: str | None = None
    pipe = _Pipe(read_fd, cancel, PersistCancelled)
    try:
        for item in items:
            header = pipe.take(_HEADER.size)
            if header is None:
                raise _ChildDied(f"its output ended after {len(out)} of {len(items)} records")
            status, size = _HEADER.unpack(header)
            payload = pipe.take(size)
            if payload is None:
                raise _ChildDied(f"its output ended inside record {item.key}")
            if status == _ERROR:
                failed = payload.decode("utf-8", "replace")
                break
            out.append(payload)
    finally:
        os.close(read_fd)
        _reap(pid, kill=failed is not None or len(out) < len(items))
    if failed is not None:
        raise InvalidState(failed)
    return out


class _Pipe:
    """The child's output, read in large chunks; waits at most :data:`POLL_S` between checks of ``cancel``, so a
    child that hangs holds the persist only until the checkpoint is aborted (the coordinator's persist deadline)."""

    def __init__(self, fd: int, cancel: threading.Event, cancelled: type[Exception]) -> None:
        self.fd, self.cancel, self.cancelled = fd, cancel, cancelled
        self.buffer = bytearray()
        self.at = 0

    def take(self, size: int) -> bytes | None:
        """The next ``size`` bytes; None if the child's output ends first."""
        while len(self.buffer) - self.at < size:
            if self.cancel.is_set():
                raise self.cancelled("cancelled while encoding")
            ready, _, _ = select.select([self.fd], [], [], POLL_S)
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            del self.buffer[: self.at]
            self.at = 0
            self.buffer += chunk
        out = bytes(self.buffer[self.at : self.at + size])
        self.at += size
        return out


def _child(encoder: RecordEncoder[F], items: Sequence[FrozenRecord[F]], write_fd: int) -> None:
    gc.disable()  # a collection would write to every tracked object's page: copied from the parent
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)  # the parent's event loop must never see this process's signals
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    with os.fdopen(write_fd, "wb", buffering=1 << 20) as pipe:
        for item in items:
            try:
                data = encode_one(encoder, item)
            except InvalidState as exc:
                message = str(exc).encode()
                pipe.write(_HEADER.pack(_ERROR, len(message)))
                pipe.write(message)
                return
            pipe.write(_HEADER.pack(_OK, len(data)))
            pipe.write(data)


def _reap(pid: int, kill: bool) -> None:
    """Wait for the child (killed first when its output is not wanted any more)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
