"""The C allocator's settings for a long-running server (glibc only; elsewhere nothing changes).

A server's largest allocations are request and response bodies, a finished result's JSON and a checkpoint's
pack buffers: 64 KB to a few MB each, alive for a call or a minute. glibc's defaults suit them badly for a process
that runs for days: the threshold above which a block gets its own mapping (returned to the system when freed)
starts at 128 KB and rises to the size of every mapped block freed, so after the first such free these blocks come
from the heap, where a younger small block left above them keeps their pages resident once they are freed; and
every thread that allocates (the thread pool of tool calls, the persist and its uploads) may get its own heap
(up to 8 per core), each keeping its own free pages. Issue 29's hour of running showed it as resident memory
rising with every 1,000 episodes while Python's own allocations stayed flat (``benchmarks/held_memory.py``: the
growth was malloc's free-but-kept bytes).

So :func:`tune_allocator` (called by ``gymckpt serve`` before the server builds anything) fixes the mapping
threshold at :data:`MMAP_THRESHOLD` (which also stops it rising) and allows :data:`ARENA_MAX` heaps. A setting
the operator gave already (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES``) is left as
it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

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


def tune_allocator() -> dict[str, int]:
    """Apply the settings above that the environment does not give; returns what was applied (nothing when the
    C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return {}
    name = ctypes.util.find_library("c")
    if name is None:
        return {}
    libc = ctypes.CDLL(name)
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    applied: dict[str, int] = {}
    for label, param, value, variable, tunable in _SETTINGS:
        if variable in os.environ or tunable in tunables:
            continue
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[label] = value
    return applied
