"""The processes this one started and leaves running (a stack's servers, the local object store): each is kept
here until it is reaped.

A started process outlives the call that started it: ``gymckpt up`` returns, and the stack is stopped later by
pid (:mod:`.launcher`, :mod:`.objectstore`). Its ``Popen`` is kept until then, so its exit status is read
through it (``poll``) when it ends, and Python never finds a ``Popen`` dropped while its child runs (a
``ResourceWarning``, an error under the test suite's warning filter). Children that ended on their own are
reaped whenever another one starts, as :mod:`subprocess` does for the ``Popen`` objects it collects. Threads start
and stop children at once (a stack's servers start in parallel): the kept set is changed under one lock.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import threading

_kept: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def keep(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Keep ``proc`` until :func:`reap` finds it ended; reap the kept children that already ended."""
    with _lock:
        for pid, child in list(_kept.items()):
            if child.poll() is not None:
                del _kept[pid]
        _kept[proc.pid] = proc
    return proc


def reap(pid: int) -> None:
    """Read ``pid``'s exit status if it ended (no zombie stays), through its ``Popen`` when this process kept one."""
    with _lock:
        child = _kept.get(pid)
        if child is None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        elif child.poll() is not None:
            del _kept[pid]


@atexit.register
def _reap_ended() -> None:
    """At exit, read the status of every kept child that ended (stopped by pid, never reaped): only one still
    running outlives this process, as a stack's server does after ``gymckpt up``."""
    for pid in list(_kept):
        reap(pid)
