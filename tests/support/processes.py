"""Processes a test started and left running, found through an environment mark (Linux ``/proc``).

While a test function runs, ``GYMCKPT_TEST_PROCESS`` holds a mark unique to that test; every process it starts
inherits it (and so do their children, even once re-parented or in a session of their own). After the test's
fixtures are torn down, a process still carrying the mark was started by the test and never stopped: the root
``conftest.py`` kills it and fails the test, so a leak is a test error and never outlives the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

MARK = "GYMCKPT_TEST_PROCESS"


def marked(tag: str) -> dict[int, str]:
    """Living processes (not zombies) whose environment carries ``MARK=tag``: pid -> command line."""
    needle = f"{MARK}={tag}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                continue
            found[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            )
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


#: how long a process marked as leaked may take to go (a SIGKILL just sent takes a moment to land); the guard's own
#: test runs its leaking tests with a short one
GRACE_ENV = "GYMCKPT_TEST_LEAK_GRACE_S"


def reap_leaked(tag: str, grace_s: float | None = None) -> dict[int, str]:
    """Processes marked ``tag`` still alive after ``grace_s`` (default 3 s, or ``GYMCKPT_TEST_LEAK_GRACE_S``):
    each is SIGKILLed; returns what was found."""
    if grace_s is None:
        grace_s = float(os.environ.get(GRACE_ENV, "3"))
    deadline = time.monotonic() + grace_s
    leaked = marked(tag)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = marked(tag)
    for pid in leaked:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return leaked
