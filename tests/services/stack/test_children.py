"""The kept children of a process, changed from several threads at once (a stack's servers start in parallel)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

from gym_services.stack import children


class SlowPoll(subprocess.Popen[bytes]):
    """A child whose status takes a moment to read: two threads then look at an ended child at the same time."""

    def poll(self) -> Any:
        time.sleep(0.05)
        return super().poll()


def test_threads_keep_and_reap_children_at_once_without_losing_track() -> None:
    ended = children.keep(SlowPoll([sys.executable, "-c", "pass"]))
    ended.wait()
    errors: list[BaseException] = []

    def start_and_reap() -> None:
        try:
            proc = children.keep(SlowPoll([sys.executable, "-c", "pass"]))  # reaps the ended one
            children.reap(ended.pid)
            proc.wait()
            children.reap(proc.pid)
        except BaseException as exc:  # what a thread raised is the test's failure
            errors.append(exc)

    threads = [threading.Thread(target=start_and_reap) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert ended.pid not in children._kept
