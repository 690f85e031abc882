"""How many cores a set of processes, and the whole machine, used in a window of a benchmark's run.

A :class:`CpuClock` reads, once a second in the benchmark's event loop, the CPU time each named process has used
(``/proc/<pid>/stat``: user and system time of its threads, and of its children once reaped: a forked encoder's)
and the machine's busy time (``/proc/stat``: every CPU's time not idle, what other users' processes took
included). Over a window, a process's cores are its CPU seconds over the window's seconds; the machine's busy cores
set beside the cores it has (:func:`os.cpu_count`) show whether anything was left for more work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
#: a sample this close outside a window still bounds it (one taken just before the window's start)
SLACK_S = 0.05


def process_cpu_s(pid: int) -> float | None:
    """User and system seconds of ``pid`` and of its reaped children; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command's name: state, ppid, ...
    return sum(int(v) for v in fields[11:15]) / TICKS  # utime, stime, cutime, cstime


def machine_busy_s() -> float:
    """Seconds every CPU of the machine spent not idle (nor waiting for I/O) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICKS


class CpuClock:
    """Samples :func:`process_cpu_s` of ``pids`` (name -> pid) and :func:`machine_busy_s` every ``every_s``."""

    def __init__(self, pids: dict[str, int], every_s: float = 1.0) -> None:
        self.pids = pids
        self.every_s = every_s
        self.samples: list[tuple[float, float, dict[str, float]]] = []  # (monotonic, machine busy s, name -> cpu s)
        self._task = asyncio.create_task(self._run())

    def sample(self) -> None:
        used = {name: cpu for name, pid in self.pids.items() if (cpu := process_cpu_s(pid)) is not None}
        self.samples.append((time.monotonic(), machine_busy_s(), used))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.every_s)

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Cores used over [start, end] (between the samples nearest inside it): ``machine`` and each process that
        lived through it; {} when fewer than two samples fall in it."""
        inside = [s for s in self.samples if start - SLACK_S <= s[0] <= end + SLACK_S]
        if len(inside) < 2:
            return {}
        (t0, busy0, used0), (t1, busy1, used1) = inside[0], inside[-1]
        span = t1 - t0
        out = {"machine": (busy1 - busy0) / span}
        out.update({name: (used1[name] - used0[name]) / span for name in used1 if name in used0})
        return out

    def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(Exception):
            self.sample()
