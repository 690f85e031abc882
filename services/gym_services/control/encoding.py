"""Encoding a capture's frozen records in forked children, off the serving process's GIL.

Called by :class:`gym_services.control.packs.PackWriter` (the background persist after ``resume``). Encoding is
pure-Python CPU work: in a thread of the serving process it holds the GIL about half the time, so every
request the server answers meanwhile waits for it, and on a 2-core machine under 8 clients' calls the persist of
1,000 Workplace sessions took 7-14 s (``docs/decisions.md``). A child made by ``fork`` sees the capture exactly as
it was frozen (the participant's :class:`~gym_services.control.participant.RecordEncoder` reads only what the
capture froze) and encodes it in a process of its own; the parent only reads the bytes back from pipes (which
releases the GIL) and keeps serving. A large capture can be split into contiguous shares, one child each
(:func:`encode_processes`: ``GYMCKPT_ENCODE_PROCESSES``, default one), for a node with cores to spare.

The children run nothing but the encoders: they never touch the event loop, storage, locks or logging, stop
cyclic garbage collection (whose passes would write to, and so copy, every page they share with the parent),
and end with ``os._exit``. While they live the parent's heap is frozen from its collector too (``gc.freeze``):
a collection there would copy the pages from the children's side of the sharing instead. A child that dies is
reported and its share encoded in the thread instead; one that hangs is killed when the checkpoint is cancelled
(``abort``, or the server stopping). Captures under :data:`FORK_MIN_RECORDS` frozen records are encoded in the
thread (a fork costs more).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, NoReturn, TypeVar

from gym_services.base.logs import get_logger
from gym_services.control.participant import FrozenRecord, InvalidState, RecordEncoder

log = get_logger("control")
#: the state of the frozen records one encoder takes
F = TypeVar("F")
#: fewer frozen records than this are encoded in the calling thread
FORK_MIN_RECORDS = 64
#: at most this many children encode one capture (``GYMCKPT_ENCODE_PROCESSES``)
MAX_PROCESSES = 4
#: how much lower the children's scheduling priority is than the serving process's: they share its CPU (its cgroup,
#: its autogroup), and a call it answers must not wait behind them
CHILD_NICE = 10
_HEADER = struct.Struct("<BQ")  # status (0: bytes follow, 1: an error message follows), length
_OK, _ERROR = 0, 1
#: how long reading the child's output waits before it checks for cancel again
POLL_S = 0.25


class PersistCancelled(Exception):
    """The checkpoint was aborted (or the server is stopping) while its records were being encoded or written.

    Raised here (an encode cancelled while its children run) and by :mod:`.packs` (cancelled while uploading)."""


def encode_processes() -> int:
    """How many children split a large capture: ``GYMCKPT_ENCODE_PROCESSES`` if set, else one. On a 2-core machine
    busy serving, a second child only added copy-on-write work (``docs/decisions.md``); on a node with cores to spare,
    set it to their number."""
    given = os.environ.get("GYMCKPT_ENCODE_PROCESSES", "").strip()
    if given:
        try:
            return max(1, min(MAX_PROCESSES, int(given)))
        except ValueError:
            log.warning(f"GYMCKPT_ENCODE_PROCESSES={given!r} is not a number; encoding in one child")
    return 1


def encode_frozen(
    encoder: RecordEncoder[F], items: Sequence[FrozenRecord[F]], cancel: threading.Event, processes: int | None = None
) -> list[bytes]:
    """Every item's bytes made by ``encoder``, in order; :class:`InvalidState` for a record that cannot be encoded.

    Encoded in ``processes`` forked children (default :func:`encode_processes`), each taking a contiguous share of at
    least :data:`FORK_MIN_RECORDS` records; fewer records than that are encoded in the calling thread."""
    if len(items) < FORK_MIN_RECORDS or not hasattr(os, "fork"):
        return [encode_one(encoder, item) for item in items]
    wanted = encode_processes() if processes is None else processes
    children = max(1, min(wanted, len(items) // FORK_MIN_RECORDS))
    bounds = [len(items) * k // children for k in range(children + 1)]
    shares = [items[bounds[k] : bounds[k + 1]] for k in range(children)]
    return _encode_forked(encoder, shares, cancel)


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


@dataclass
class _Share(Generic[F]):
    """One child's share of the records, the pipe it writes them to, and what it has written back so far."""

    items: Sequence[FrozenRecord[F]]
    fd: int
    output: bytearray = field(default_factory=bytearray)
    ended: bool = False


def _encode_forked(
    encoder: RecordEncoder[F], shares: Sequence[Sequence[FrozenRecord[F]]], cancel: threading.Event
) -> list[bytes]:
    """One forked child (the serving process pauses once, for one fork) forks the others: each writes its share to
    a pipe of its own, read here as the output comes. They form one process group, killed together."""
    pipes = [os.pipe() for _ in shares]
    running = [_Share(items, read_fd) for items, (read_fd, _) in zip(shares, pipes, strict=True)]
    with _frozen_heap():
        try:
            pid = os.fork()
        except BaseException:
            for read_fd, write_fd in pipes:
                os.close(read_fd)
                os.close(write_fd)
            raise
        if pid == 0:  # the first child: never returns into the parent's code
            _first_child(encoder, shares, pipes)
        with contextlib.suppress(OSError):  # (the child does the same: whichever runs first)
            os.setpgid(pid, pid)
        for _, write_fd in pipes:
            os.close(write_fd)
        try:
            _read_all(running, cancel)
        except BaseException:
            for share in running:
                if share.fd >= 0:
                    os.close(share.fd)
            _reap(pid, kill=True)
            raise
        _reap(pid, kill=False)  # every output has ended; the first child has reaped the others
    out: list[bytes] = []
    for share in running:  # in order: the first record that cannot be encoded is the one named
        try:
            out += _parse(share)
        except _ChildDied as exc:
            log.warning(f"encoding child failed ({exc}); encoding its {len(share.items)} records in the thread instead")
            out += [encode_one(encoder, item) for item in share.items]
    return out


def _first_child(
    encoder: RecordEncoder[F], shares: Sequence[Sequence[FrozenRecord[F]]], pipes: list[tuple[int, int]]
) -> NoReturn:
    """Fork a child per further share, encode the first, wait for the others, exit."""
    status = 1
    try:
        gc.disable()  # before its own forks too (see _child)
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        with contextlib.suppress(OSError):  # background work: the serving process comes first (the others inherit it)
            os.nice(CHILD_NICE)
        for read_fd, _ in pipes:
            os.close(read_fd)
        others = []
        for k in range(1, len(shares)):
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    for j, (_, write_fd) in enumerate(pipes):
                        if j != k:  # another share's pipe: not this process's to hold open
                            with contextlib.suppress(OSError):
                                os.close(write_fd)
                    _child(encoder, shares[k], pipes[k][1])
                    status = 0
                finally:
                    os._exit(status)
            os.close(pipes[k][1])
            others.append(pid)
        _child(encoder, shares[0], pipes[0][1])
        for pid in others:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        status = 0
    finally:
        os._exit(status)


_frozen_lock = threading.Lock()
_frozen_users = 0


class HeapHold:
    """One holder's claim on keeping the serving process's heap frozen from its cyclic collector (``gc.freeze``).

    Taking one freezes every object alive now (O(1): the generations move into the permanent one); the heap is
    unfrozen (``gc.unfreeze``: back into the oldest generation) when the last hold is released. Holders: an encode
    while its children live (:func:`_frozen_heap`), and a capture from its end under the pause until its persist
    ends or the capture is dropped (:func:`gym_services.control.gc_pause.collection_paused`). :meth:`release` is
    idempotent, so a holder with several ways to end releases once."""

    def __init__(self) -> None:
        global _frozen_users
        self._held = True
        with _frozen_lock:
            _frozen_users += 1
            gc.freeze()  # every hold: what was made since an earlier hold is frozen too

    def release(self) -> None:
        global _frozen_users
        with _frozen_lock:
            if not self._held:
                return
            self._held = False
            _frozen_users -= 1
            if _frozen_users == 0:
                gc.unfreeze()


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Keep the serving process's cyclic collector off every object that existed at the fork while children live.

    Every page is shared with the children until one side writes it, and a collection writes the header of each
    object it visits: a full collection in the parent during an encode (10,000 sessions are millions of objects)
    would copy most of the heap, page fault by page fault, with the GIL held. A :class:`HeapHold` for the encode."""
    hold = HeapHold()
    try:
        yield
    finally:
        hold.release()


def _read_all(shares: list[_Share[F]], cancel: threading.Event) -> None:
    """Every child's whole output, read as it comes (a child blocks once its pipe is full); checks ``cancel`` at
    least every :data:`POLL_S`, so a child that hangs holds the persist only until the checkpoint is aborted."""
    while True:
        if cancel.is_set():
            raise PersistCancelled("cancelled while encoding")
        open_fds = {s.fd: s for s in shares if not s.ended}
        if not open_fds:
            return
        # poll, not select: a server with thousands of connections has descriptors past select's 1024
        poller = select.poll()
        for fd in open_fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        ready = [fd for fd, _ in poller.poll(POLL_S * 1000)]
        for fd in ready:
            share = open_fds[fd]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                share.output += chunk
            else:
                share.ended = True
                os.close(fd)
                share.fd = -1


def _parse(share: _Share[F]) -> list[bytes]:
    """The share's bytes from its child's output; :class:`InvalidState` if the child could not encode a record."""
    out: list[bytes] = []
    view = memoryview(share.output)
    at = 0
    for item in share.items:
        if len(view) - at < _HEADER.size:
            raise _ChildDied(f"its output ended after {len(out)} of {len(share.items)} records")
        status, size = _HEADER.unpack_from(view, at)
        at += _HEADER.size
        if len(view) - at < size:
            raise _ChildDied(f"its output ended inside record {item.key}")
        payload = bytes(view[at : at + size])
        at += size
        if status == _ERROR:
            raise InvalidState(payload.decode("utf-8", "replace"))
        out.append(payload)
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
    """Wait for the first child (it and the children it forked killed first when their output is not wanted)."""
    if kill:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
