"""Following a collection job until it completes: progress on stderr (a bar on a terminal, a line every 5 s
otherwise), the servers the agents wait for, a warning when the job makes no progress or its server does
not answer, and a line when the job resumed from a checkpoint (the stack stopped and `gymckpt up` restored it: the
local collection server is found again at its new address)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gym_services.base.downstream import DownstreamFailure
from gym_services.commands.stack.jobs import CollectError, answer

if TYPE_CHECKING:
    import httpx

Say = Callable[[str], None]


class Stall:
    """Says on stderr when a followed job makes no progress, or its server does not answer, for long."""

    def __init__(self, url: str, after_s: float, say: Say, missing: Callable[[], list[str]] | None = None) -> None:
        self.url, self.after_s, self.say = url, after_s, say
        #: the local stack's servers that are not running (a crashed one is the likely cause of a stall)
        self.missing: Callable[[], list[str]] = missing or list
        self.finished: int | None = None
        self.progress_at = self.answered_at = time.monotonic()
        self.warned_at = 0.0
        self.last_error = ""

    def _due(self, since: float) -> bool:
        now = time.monotonic()
        if now - since < self.after_s or now - self.warned_at < self.after_s:
            return False
        self.warned_at = now
        return True

    def seen(self, status: dict[str, Any]) -> None:
        now = time.monotonic()
        self.answered_at = now
        if status["finished"] != self.finished:
            self.finished, self.progress_at = status["finished"], now
        if status["state"] in ("running", "paused") and self._due(self.progress_at):
            idle = status.get("idle_s") or now - self.progress_at
            why = f"{status['live']} live, {status['state']}"
            if status.get("retrying"):
                why += f"; {status['retrying']} waiting to run again after an infrastructure failure"
            if status.get("last_failure"):
                why += f"; cause: {status['last_failure']}"
            down = self.missing()
            if down:
                why += f"; not running: {', '.join(down)} (`gymckpt up CONFIG` starts it again)"
            self.say(
                f"gymckpt collect: no episode has finished for {idle:.0f}s ({why}); "
                "`gymckpt status` shows every server, their logs say more"
            )

    def unanswered(self, exc: Exception) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._due(self.answered_at):
            self.say(
                f"gymckpt collect: the collection server at {self.url} has not answered for "
                f"{time.monotonic() - self.answered_at:.0f}s ({self.last_error}); still trying until --wait-timeout"
            )


def waiting_lines(status: dict[str, Any]) -> list[str]:
    """``agent A waits for resources /seed_session: unreachable since ...``, one per server an agent's episodes
    are retrying (the job status's ``failing``)."""
    lines = []
    for agent, failures in sorted((status.get("failing") or {}).items()):
        for failure in failures:
            try:
                lines.append(f"agent {agent} waits for {DownstreamFailure.model_validate(failure).describe()}")
            except ValidationError:
                continue
    return lines


class _Lines:
    """What following prints as the status changes: the servers the agents wait for, and the progress (a bar
    on a terminal, else a line every 5 s and the last one)."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="rollout", desc="collect", file=sys.stderr) if sys.stderr.isatty() else None
        self.last_line = 0.0
        self.waiting_for: list[str] = []

    def say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def show(self, status: dict[str, Any]) -> None:
        now_waiting = waiting_lines(status)
        if [line.split(" since ")[0] for line in now_waiting] != [
            line.split(" since ")[0] for line in self.waiting_for
        ]:
            if now_waiting:
                for line in now_waiting:
                    self.say(f"collect: {line}")
            elif status["state"] != "completed":
                self.say("collect: the servers the agents waited for answer again")
            self.waiting_for = now_waiting
        if self.bar is not None:
            self.bar.n = status["finished"]
            self.bar.set_postfix(live=status["live"], state=status["state"])
            self.bar.refresh()
        elif time.monotonic() - self.last_line >= 5 or status["state"] == "completed":
            self.last_line = time.monotonic()
            print(
                f"collect: {status['finished']}/{status['total']} finished, {status['live']} live, {status['state']}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def follow(
    http: httpx.Client,
    url: str,
    status: dict[str, Any],
    wait_timeout: float,
    stall_warning_s: float = 60.0,
    missing: Callable[[], list[str]] | None = None,
    relocate: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Poll until the job completes (bounded by ``wait_timeout``); progress on stderr, a bar on a terminal;
    a job making no progress (or a server not answering) for ``stall_warning_s`` is reported there too.
    ``relocate`` says where the collection server is now, when it stops answering where it was."""
    deadline = time.monotonic() + wait_timeout
    lines = _Lines(status["total"])
    stall = Stall(url, stall_warning_s, lines.say, missing)
    resumed_from = status.get("resumed_from")
    try:
        while True:
            stall.seen(status)
            if status.get("resumed_from") != resumed_from:
                resumed_from = status.get("resumed_from")
                lines.say(
                    f"collect: the job resumed from checkpoint {resumed_from}: {status.get('resumed_episodes', 0)} "
                    f"episodes in flight continue as attempt + 1, {status['finished']} results kept"
                )
            lines.show(status)
            if status["state"] == "completed":
                return status
            if time.monotonic() > deadline:
                raise CollectError(
                    f"the job did not complete within --wait-timeout {wait_timeout:.0f}s; it keeps running: "
                    "`gymckpt collect --attach` follows it again"
                )
            time.sleep(0.2)
            url, status = _poll(http, url, stall, deadline, wait_timeout, relocate)
    finally:
        lines.close()


def _poll(
    http: httpx.Client,
    url: str,
    stall: Stall,
    deadline: float,
    wait_timeout: float,
    relocate: Callable[[], str | None] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Where the server is and the job's status; a server being replaced is asked again (where ``relocate`` says
    it is now) until the deadline."""
    import httpx

    while True:
        try:
            status = answer(http.get(f"{url}/jobs/current"))
            if status["state"] != "idle":
                return url, status
            # a fresh collection server with no job yet: the stack was started again and is being restored
            stall.unanswered(CollectError("it has no job: the stack is being restored, or was started --fresh"))
            if time.monotonic() > deadline:
                raise CollectError(f"the collection server at {url} has no job any more (it was started fresh)")
            time.sleep(0.5)
        except httpx.TransportError as exc:
            url = (relocate() if relocate is not None else None) or url
            stall.unanswered(exc)
            if time.monotonic() > deadline:
                raise CollectError(
                    f"the collection server at {url} stopped answering ({stall.last_error}) "
                    f"and --wait-timeout {wait_timeout:.0f}s ran out"
                ) from None
            time.sleep(0.5)
