"""The C allocator's settings for a long-running server (glibc only; elsewhere nothing changes).

A server's largest allocations are request and response bodies, a finished result's JSON and a checkpoint's
pack buffers: 64 KB to a few MB each, alive for a call or a minute. glibc's defaults suit them badly for a process
that runs for days: the threshold above which a block gets its own mapping (returned to the system when freed)
starts at 128 KB and rises to the size of every mapped block freed, so after the first such free these blocks come
from the heap, where a younger small block left above them keeps their pages resident once they are freed; and
every thread that allocates (the thread pool of tool calls, the persist and its uploads) may get its own heap
(up to 8 per core), each keeping its own free pages. An hour's soak (``benchmarks/RESULTS.md``) showed it as
resident memory rising with every 1,000 episodes while Python's own allocations stayed flat
(``benchmarks/held_memory.py``: the growth was malloc's free-but-kept bytes).

So :func:`tune_allocator` (called by ``gymckpt serve`` before the server builds anything) fixes the mapping
threshold at :data:`MMAP_THRESHOLD` (which also stops it rising) and allows :data:`ARENA_MAX` heaps. A setting
the operator gave already (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES``) is left as
it is.

Smaller blocks still come from the heaps, and glibc gives a heap's free pages back only from its top: pages freed
below a live block stay resident (the soak: malloc's free-but-kept bytes still grew 9-13 MB per 1,000 episodes in
agent-ipi, agent-workplace and the policy model). jemalloc and tcmalloc return such pages after they have been
free for a while; glibc has no such clock, so a :class:`Trimmer` thread calls ``malloc_trim(0)``, which returns
every free page of every heap, once per ``memory_trim_interval_s`` (the server's config; 0: never). It holds one
heap's lock at a time for a few milliseconds, and Python's lock (GIL) not at all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from dataclasses import dataclass, field

#: blocks this large or larger get their own mapping, returned to the system when freed
MMAP_THRESHOLD = 64 * 1024
#: heaps the allocator may keep (the main one and one shared by every other thread)
ARENA_MAX = 2
#: mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: parameter, its value, the environment variable and the GLIBC_TUNABLES name that set it already
_SETTINGS = (
    ("mmap_threshold", M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    ("arena_max", M_ARENA_MAX, ARENA_MAX, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
)


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (whose malloc these settings and calls are), else None."""
    if platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name is not None else None


def tune_allocator() -> dict[str, int]:
    """Apply the settings above that the environment does not give; returns what was applied (nothing when the
    C library is not glibc)."""
    libc = _glibc()
    if libc is None:
        return {}
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    applied: dict[str, int] = {}
    for label, param, value, variable, tunable in _SETTINGS:
        if variable in os.environ or tunable in tunables:
            continue
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[label] = value
    return applied


@dataclass
class Trimmer:
    """A daemon thread that gives malloc's free pages back to the system every ``interval_s`` seconds."""

    interval_s: float
    libc: ctypes.CDLL
    #: trims done
    trims: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def start(cls, interval_s: float) -> Trimmer | None:
        """A running trimmer; None when ``interval_s`` is 0 or the C library is not glibc."""
        libc = _glibc()
        if interval_s <= 0 or libc is None:
            return None
        trimmer = cls(interval_s, libc)
        trimmer._thread = threading.Thread(target=trimmer._run, name="malloc-trim", daemon=True)
        trimmer._thread.start()
        return trimmer

    def trim(self) -> None:
        """One ``malloc_trim(0)`` (ctypes lets go of the GIL for it)."""
        self.libc.malloc_trim(ctypes.c_size_t(0))
        self.trims += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
