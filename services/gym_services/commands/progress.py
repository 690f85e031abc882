"""Progress of a collection job on stderr: a bar on a terminal, plain lines otherwise.

A bar redraws itself with carriage returns, which turn into one long unreadable line in a log file
or a pipe, so when stderr is not a terminal each change is one line: what finished, what is live,
and at most one line per ``interval_s`` while nothing changes.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any


class JobProgress:
    """Shows each ``{"total", "finished", "live", "errors"}`` status of one job per label, as it arrives."""

    def __init__(self, stream: IO[str] | None = None, *, interval_s: float = 10.0, position: int = 0) -> None:
        self.stream = stream or sys.stderr
        self.position = position  # the bar's line, when several show at once
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self._bar: Any = None
        self._label: str | None = None
        self._last: tuple[Any, ...] | None = None
        self._last_at = 0.0
        self._changed_at = time.monotonic()

    def __call__(self, label: str, job: dict[str, Any]) -> None:
        if label != self._label:
            self.close()
            self._label = label
        if self.interactive:
            self._draw(label, job)
        else:
            self._line(label, job)

    def _draw(self, label: str, job: dict[str, Any]) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(
                total=job.get("total") or 0,
                desc=f"{label:>18}",
                unit="ep",
                file=self.stream,
                leave=True,
                position=self.position,
            )
        self._bar.total = job.get("total") or self._bar.total
        self._bar.n = job.get("finished", 0)
        self._bar.set_postfix(live=job.get("live", 0))
        self._bar.refresh()

    def _line(self, label: str, job: dict[str, Any]) -> None:
        state = (
            job.get("finished", 0),
            job.get("total", 0),
            job.get("live", 0),
            job.get("errors", 0),
            job.get("state"),
        )
        now = time.monotonic()
        if state != self._last:
            self._changed_at = now
        elif now - self._last_at < self.interval_s:
            return
        self._last, self._last_at = state, now
        finished, total, live, errors, phase = state
        line = f"{label}: {finished}/{total} episodes finished, {live} live"
        if errors:
            line += f", {errors} errors"
        if phase and phase != "running":
            line += f" ({phase})"
        if now - self._changed_at >= self.interval_s:  # a job making no progress says so, and why if it knows
            line += f"; nothing finished for {now - self._changed_at:.0f}s"
            if job.get("retrying"):
                line += f", {job['retrying']} waiting to run again after an infrastructure failure"
            if job.get("last_failure"):
                line += f" (latest: {job['last_failure']})"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._last = None
