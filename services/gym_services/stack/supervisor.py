"""The supervisor of a local stack: one small process beside the servers that checkpoints the stack by itself.

``gymckpt up`` starts it (:func:`gym_services.stack.launcher.start_supervisor`, recorded in the state file) and
``gymckpt down`` stops it. It runs ``python -m gym_services.stack.supervisor STATE_DIR`` and:

- takes a checkpoint every ``checkpoint.every`` (:mod:`gym_services.stack.schedule`), one at a time, and deletes
  its checkpoints beyond ``keep``, oldest first, never one a restore is reading;
- learns that a server got SIGTERM by holding one ``status`` long-poll open on each participant (it answers the
  moment the server is terminating): nothing polls, so the schedule is the supervisor's only cost to the rollouts,
  and a signal is seen within milliseconds wherever it came from (``gymckpt down``, a scheduler, anyone's ``kill``);
- on such a signal (or SIGTERM to itself) takes the final checkpoint of the whole stack before the first deadline
  (:mod:`gym_services.stack.final`), after the scheduled checkpoint under way if there is one, then stops every
  server still running and the stack's local S3 store, and exits;
- on SIGINT (``gymckpt down --no-checkpoint``) ends what it is doing without a checkpoint and exits.

What it did is in the stack's history (:mod:`gym_services.stack.history`), read by ``gymckpt status`` and by the
next ``gymckpt up``, which resumes from it; its JSON log is ``logs/supervisor.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from gym_services.base.logs import configure_logging, get_logger
from gym_services.control.models import TerminationStatus
from gym_services.control.protocol import DEFAULT_LEASE_S, DEFAULT_PREPARE_TIMEOUT_S
from gym_services.control.retention import Retention, restoring
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_services.coordination.transaction import TransactionKind, TransactionPhase, TransactionStatus
from gym_services.stack.discovery import discover
from gym_services.stack.final import FinalOutcome, take_final
from gym_services.stack.history import StackHistory, TakenCheckpoint, Termination, read_history, write_history
from gym_services.stack.launcher import (
    StackError,
    StackState,
    is_running,
    read_state,
    stack_secrets,
    stack_storage_config,
    stop_servers_after,
)
from gym_services.stack.objectstore import stop_local_s3
from gym_services.stack.schedule import CheckpointSettings

log = get_logger("supervisor")

#: how long one status long-poll waits for a termination before it is asked again
LONG_POLL_S = 30.0
#: how often the history says the supervisor is alive (what a crash is dated by)
HEARTBEAT_S = 1.0


def scheduled_checkpoint_id(now: float | None = None) -> str:
    return f"sched-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"


class Supervisor:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.state: StackState = read_state(state_dir)
        self.settings: CheckpointSettings = self.state.checkpoint or CheckpointSettings()
        self.history = read_history(state_dir) or StackHistory()
        self.history.settings = self.settings
        self.history.stopped = None
        self.token = stack_secrets(state_dir)["control_token"]
        self.location = self.state.storage
        self.claimed_by = f"gymckpt supervisor on {socket.gethostname()} (stack {self.state.name})"
        self.busy = asyncio.Lock()  # one transaction at a time: the schedule's or the termination's
        self.terminating = asyncio.Event()
        self.stopping = asyncio.Event()
        self.cancel_scheduled = asyncio.Event()
        #: who got a termination signal -> its status (the supervisor itself: a status of its own making)
        self.signalled: dict[str, TerminationStatus] = {}
        #: why it stops without a termination: asked to (SIGINT), or None (every server is gone: a crash)
        self.stop_reason: Literal["no_checkpoint"] | None = None

    # --- the process ---------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._signalled_itself)
        loop.add_signal_handler(signal.SIGINT, self._stop_without_checkpoint)
        log.info("supervising", extra={"stack": self.state.name, "settings": self.settings.describe()})
        self._save()
        async with ControlClient(self.token, timeout_s=DEFAULT_LEASE_S) as client:
            participants = await self._discover(client)
            self.coordinator = Coordinator(participants, client, storage_config=stack_storage_config(self.state))
            background: list[asyncio.Task[Any]] = [
                asyncio.create_task(self._schedule(), name="schedule"),
                asyncio.create_task(self._heartbeat(), name="heartbeat"),
                *(
                    asyncio.create_task(self._watch(client, ref), name=f"watch-{ref.participant_id}")
                    for ref in participants
                ),
            ]
            ended = [asyncio.create_task(e.wait()) for e in (self.terminating, self.stopping)]
            await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
            for task in ended:
                task.cancel()
            if self.terminating.is_set():
                await self._terminate()
            else:
                await self._stop()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        self._save()
        log.info("supervisor stopped", extra={"stopped": self.history.stopped})
        return 0

    async def _discover(self, client: ControlClient) -> list[ParticipantRef]:
        """The participants; a server still starting is asked again for a few seconds."""
        for _ in range(50):
            try:
                return await discover(self.state, client)
            except Exception as exc:
                log.warning("a participant does not answer yet", extra={"error": str(exc)})
                await asyncio.sleep(0.2)
        return await discover(self.state, client)

    def _save(self) -> None:
        self.history.seen_running_at = time.time()
        with contextlib.suppress(OSError):
            write_history(self.state_dir, self.history)

    async def _heartbeat(self) -> None:
        """Say the supervisor is alive; once no server of the stack runs and none was signalled (a crash took them
        all, or someone killed them), there is nothing left to supervise."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            servers = self._current().servers
            if servers and not any(is_running(s) for s in servers) and not self.signalled:
                log.error("every server of the stack is gone without a termination signal (a crash): stopping")
                self.cancel_scheduled.set()
                self.stopping.set()
                return
            self._save()

    # --- the schedule -----------------------------------------------------------------------

    async def _schedule(self) -> None:
        every = self.settings.every
        if every is None:
            return
        due = time.monotonic() + every
        while not (self.terminating.is_set() or self.stopping.is_set()):
            self.history.next_at = time.time() + max(0.0, due - time.monotonic())
            self._save()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if self.terminating.is_set() or self.stopping.is_set():
                break
            started = time.monotonic()
            async with self.busy:
                if self.terminating.is_set() or self.stopping.is_set():
                    break
                await self._scheduled()
            if time.monotonic() - started > every:
                log.warning(
                    "a scheduled checkpoint took longer than the interval; the next one starts now",
                    extra={"every_s": every, "took_s": round(time.monotonic() - started, 3)},
                )
            due = max(started + every, time.monotonic())
        self.history.next_at = None

    async def _scheduled(self) -> None:
        checkpoint_id = scheduled_checkpoint_id()
        taken = TakenCheckpoint(
            checkpoint_id=checkpoint_id, kind="scheduled", lineage=self.history.lineage, started_at=time.time()
        )
        self.history.last = taken
        self._save()
        self.cancel_scheduled.clear()
        every = self.settings.every or DEFAULT_PREPARE_TIMEOUT_S
        result = await self.coordinator.checkpoint(
            checkpoint_id,
            self.location,
            prepare_timeout_s=min(DEFAULT_PREPARE_TIMEOUT_S, max(2.0, every / 3)),
            lease_s=DEFAULT_LEASE_S,
            claimed_by=self.claimed_by,
            cancel=self.cancel_scheduled,
        )
        self._record(taken, result)
        if result.completed:
            if taken.seconds is not None and taken.seconds > self.settings.termination_grace:
                log.warning(
                    "a checkpoint took longer than the termination grace: a final checkpoint may not fit in it",
                    extra={"seconds": taken.seconds, "grace_s": self.settings.termination_grace},
                )
            await self._prune()

    def _record(self, taken: TakenCheckpoint, result: TransactionResult) -> None:
        taken.ended_at = time.time()
        taken.seconds = round(taken.ended_at - taken.started_at, 3)
        taken.status = "completed" if result.completed else "failed"
        taken.error = result.error
        taken.pause_s = result.pause_s
        taken.records, taken.bytes, taken.episodes = result.records, result.bytes, len(result.episodes)
        taken.final = result.final
        if result.completed:
            self.history.kept.append(taken)
            log.info(
                "checkpoint published",
                extra={"checkpoint_id": taken.checkpoint_id, "kind": taken.kind, "seconds": taken.seconds},
            )
        else:
            log.warning(
                "checkpoint failed",
                extra={"checkpoint_id": taken.checkpoint_id, "kind": taken.kind, "error": taken.error},
            )
        self._save()

    async def _prune(self) -> None:
        """Delete this stack's checkpoints beyond ``keep``, oldest first; never one a restore is reading."""
        excess = len(self.history.kept) - self.settings.keep
        if excess <= 0:
            return
        statuses = await self.coordinator.status()
        retention = Retention(CheckpointStore(open_storage(self.location, stack_storage_config(self.state))))
        for old in list(self.history.kept[:excess]):
            if restoring(statuses, old.checkpoint_id):
                log.info("not deleted while a restore reads it", extra={"checkpoint_id": old.checkpoint_id})
                continue
            try:
                await asyncio.to_thread(retention.delete, old.checkpoint_id, by=self.claimed_by)
            except (StorageError, OSError) as exc:
                log.warning(
                    "could not delete an old checkpoint", extra={"checkpoint_id": old.checkpoint_id, "error": str(exc)}
                )
                continue
            self.history.kept.remove(old)
            log.info("deleted beyond keep", extra={"checkpoint_id": old.checkpoint_id, "keep": self.settings.keep})
        self._save()

    # --- terminations ---------------------------------------------------------------------

    async def _watch(self, client: ControlClient, ref: ParticipantRef) -> None:
        """Hold a status long-poll open on one participant until it says it is terminating."""
        gone_logged = False
        while not self.terminating.is_set():
            try:
                status = await client.status(ref, wait_terminating_s=LONG_POLL_S, timeout_s=LONG_POLL_S + 10)
            except ParticipantError as exc:
                if not gone_logged and not self.stopping.is_set():
                    log.warning(
                        "a participant does not answer", extra={"participant": ref.participant_id, "error": exc.reason}
                    )
                    gone_logged = True
                await asyncio.sleep(1.0)
                continue
            gone_logged = False
            if status.terminating is not None:
                self._termination(ref.participant_id, status.terminating)
                return

    def _termination(self, who: str, status: TerminationStatus) -> None:
        first = not self.signalled
        self.signalled[who] = status
        log.warning(
            "termination signal" + (": taking the final checkpoint" if first else ""),
            extra={"participant": who, "signal": status.signal, "left_s": status.left_s},
        )
        self.terminating.set()

    def _signalled_itself(self) -> None:
        self.signalled_by_caller(time.time(), self.settings.termination_grace, "supervisor")

    def signalled_by_caller(self, now: float, grace: float, who: str = "gymckpt down") -> None:
        """A termination no server was signalled for: the supervisor's own SIGTERM, or ``gymckpt down`` taking the
        final checkpoint itself (no supervisor ran)."""
        self._termination(
            who,
            TerminationStatus(signal="SIGTERM", signalled_at=now, deadline_at=now + grace, left_s=grace, grace_s=grace),
        )

    def _stop_without_checkpoint(self) -> None:
        log.warning("SIGINT: stopping without a checkpoint")
        self.stop_reason = "no_checkpoint"
        self.cancel_scheduled.set()
        self.stopping.set()

    async def _terminate(self) -> None:
        """The final checkpoint before the first deadline, then every server and the local S3 store stop."""
        first = min(self.signalled.values(), key=lambda s: s.deadline_at)
        deadline = time.monotonic() + (first.deadline_at - time.time())
        record = Termination(
            signalled_at=min(s.signalled_at for s in self.signalled.values()),
            deadline_at=first.deadline_at,
            signalled=sorted(self.signalled),
        )
        self.history.termination = record
        self.history.stopped = "termination"
        self._save()
        outcome = await self._final(deadline, record)
        record.tries = outcome.tries
        if outcome.published and record.final is not None:
            record.outcome = "published"
            record.signal_to_published_s = round((record.final.ended_at or time.time()) - record.signalled_at, 3)
            log.warning(
                "final checkpoint published",
                extra={
                    "checkpoint_id": record.final.checkpoint_id,
                    "signal_to_published_s": record.signal_to_published_s,
                },
            )
        else:
            record.outcome, record.error = "failed", outcome.error
            newest = self.history.last_successful()
            log.error(
                "final checkpoint failed: the stack resumes from its newest scheduled checkpoint",
                extra={"error": outcome.error, "newest": newest.checkpoint_id if newest else None},
            )
        self._save()
        if outcome.published and record.final is not None:
            await self._release_external(record.final.checkpoint_id)
        latest = max(s.deadline_at for s in self.signalled.values())
        await asyncio.to_thread(stop_servers_after, self._current(), latest)
        if self.state.object_store is not None:
            await asyncio.to_thread(stop_local_s3, Path(self.state.object_store.data_dir))

    async def _final(self, deadline: float, record: Termination) -> FinalOutcome:
        """After the scheduled checkpoint under way (never two at once), the final one."""
        try:
            await asyncio.wait_for(self.busy.acquire(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return FinalOutcome(None, 0, "a scheduled checkpoint was still being written at the deadline")
        try:
            adopted = self._adopted(record)
            if adopted is not None:
                return adopted

            def attempt(checkpoint_id: str, n: int) -> None:
                record.final = TakenCheckpoint(
                    checkpoint_id=checkpoint_id, kind="final", lineage=self.history.lineage, started_at=time.time()
                )
                self.history.last = record.final
                self._save()
                log.warning("final checkpoint", extra={"checkpoint_id": checkpoint_id, "attempt": n})

            outcome = await take_final(
                self.coordinator,
                self.location,
                deadline,
                claimed_by=self.claimed_by,
                on_try=attempt,
                hopeless=self._gone,
            )
            if record.final is not None:
                failed = outcome.result or _failed(record.final.checkpoint_id, self.location, outcome.error)
                self._record(record.final, failed)
            if outcome.published:
                await self._prune()
            return outcome
        finally:
            self.busy.release()

    async def _release_external(self, checkpoint_id: str) -> None:
        """The stack's external participants (servers it did not start: ``external:`` in its YAML) hold the final
        checkpoint too; the supervisor stops only its own servers, so it lets them go on serving (an abort of their
        hold) instead of their exiting when the lease runs out. A restore of the stack replaces what they do next."""
        external = {server.url.rstrip("/") for server in self.state.external if server.participant}
        refs = [ref for ref in self.coordinator.participants if ref.url.rstrip("/") in external]
        if refs:
            warnings = await self.coordinator.abort_all(checkpoint_id, refs)
            log.info(
                "external participants released",
                extra={"participants": [r.participant_id for r in refs], "warnings": warnings},
            )

    def _adopted(self, record: Termination) -> FinalOutcome | None:
        """The scheduled checkpoint under way at the signal, when it became final: its prepare reached a signalled
        server after the signal, so that server held it as final, and so did every participant (the coordinator takes
        the whole checkpoint as final then: ``docs/protocol.md``, "Termination"); the signalled servers exited once
        their parts were written. It is the cut this termination ends at; no other checkpoint could include them."""
        last = self.history.last
        if last is None or last.status != "completed" or not last.final:
            return None
        if (last.ended_at or 0.0) < record.signalled_at:
            return None
        record.final = last
        log.warning(
            "the scheduled checkpoint under way at the signal is the termination's: a signalled server held it, exited",
            extra={"checkpoint_id": last.checkpoint_id},
        )
        return FinalOutcome(_completed(last.checkpoint_id, self.location), 0, None)

    def _current(self) -> StackState:
        """The state file now (``gymckpt restart`` or ``up`` may have started a server again since)."""
        try:
            return read_state(self.state_dir)
        except (StackError, OSError, ValueError):
            return self.state

    def _gone(self) -> str | None:
        """A participant of the stack whose process is gone: no final checkpoint can include it."""
        gone = [s.name for s in self._current().participants() if not is_running(s)]
        return f"not running: {', '.join(gone)}" if gone else None

    async def _stop(self) -> None:
        """SIGINT: a scheduled checkpoint under way is ended as failed (its participants are aborted)."""
        self.history.stopped = self.stop_reason
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.busy.acquire(), 10.0)
            self.busy.release()


def _completed(checkpoint_id: str, location: str) -> TransactionResult:
    return TransactionResult(
        kind=TransactionKind.CHECKPOINT,
        checkpoint_id=checkpoint_id,
        location=location,
        status=TransactionStatus.COMPLETED,
        phase=TransactionPhase.COMPLETED,
    )


def _failed(checkpoint_id: str, location: str, error: str | None) -> TransactionResult:
    return TransactionResult(
        kind=TransactionKind.CHECKPOINT,
        checkpoint_id=checkpoint_id,
        location=location,
        status=TransactionStatus.FAILED,
        phase=TransactionPhase.FAILED,
        error=error,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gym_services.stack.supervisor")
    parser.add_argument("state_dir", help="the stack's state folder")
    args = parser.parse_args(argv)
    configure_logging("supervisor")
    state_dir = Path(args.state_dir).resolve()
    try:
        supervisor = Supervisor(state_dir)
    except Exception as exc:
        log.error("cannot supervise", extra={"state_dir": str(state_dir), "error": str(exc)})
        return 2
    return asyncio.run(supervisor.run())


if __name__ == "__main__":
    sys.exit(main())
