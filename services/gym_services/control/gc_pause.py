"""No cyclic garbage collection while a capture runs under the pause, or a restore reads and validates.

Used by the capture (:mod:`gym_services.control.checkpointing`) and the restore
(:mod:`gym_services.control.restoring`) of the control plane; ``benchmarks/gc_resume.py`` and
``benchmarks/restore_decode.py`` measure what it saves.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside this block; collection is back on (if it was) when it ends.

    A capture allocates a few small objects per session; with thousands of sessions that triggers full
    collections over every live object of the server (its sessions' tables), which measured ~40% of a
    4,000-session capture. A restore keeps every session it rebuilds (pandas frames, indexes), so each
    collection it triggers walks all it rebuilt so far: ~40% of decoding 10,000 Workplace sessions
    (``docs/decisions.md``). What either allocates meanwhile is bounded by its sessions. No server call runs
    meanwhile (admission is closed).

    A capture also freezes the heap (a :class:`~gym_services.control.encoding.HeapHold`, taken inside this block,
    before collection is back on) until its persist ends or it is dropped: otherwise, when the capture's objects
    tip CPython into a full collection (they are ~3 per session, the margin a quarter of the heap), it comes in
    the first second after resume, as the parked calls retry, and walks every object of the server: ~200 ms at
    10,000 sessions (``benchmarks/gc_resume.py``). What is made after the freeze is still collected.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
