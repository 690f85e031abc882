"""Running one checkpoint or restore against the local stack: what Ctrl-C does, the summary, the exit code.

The first Ctrl-C ends the transaction as failed the way the coordinator does (every participant touched is
aborted and resumes); a second one stops waiting: the transaction's task is cancelled, so its calls and its
connections end in order (never a KeyboardInterrupt in the middle of the event loop). Either way one line says
what state things are in and the command that repeats the same transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable

from gym_services.commands.output import EXIT_INTERRUPTED, transaction_summary
from gym_services.commands.stack.running import fail, with_coordinator
from gym_services.control.storage import StorageError
from gym_services.coordination.client import ParticipantError
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_services.stack.launcher import StackError, StackState

#: the transaction itself: a coordinator over the running stack, the stack, and the event Ctrl-C sets
Work = Callable[[Coordinator, StackState, asyncio.Event], Awaitable[TransactionResult]]


def header(args: argparse.Namespace, line: str) -> None:
    """What a transaction is about to do: on stdout, on stderr under --json (stdout is the JSON alone), not
    at all under --quiet."""
    if not args.quiet:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


class Interrupts:
    """Ctrl-C while a transaction runs: the first sets ``cancel`` (the coordinator aborts), the second cancels
    ``main`` (stop waiting)."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.count = 0
        self.cancel = asyncio.Event()
        self.main: asyncio.Task[object] | None = None

    def __call__(self) -> None:
        self.count += 1
        if self.count == 1:
            print(
                f"\ngymckpt {self.verb}: Ctrl-C: ending the {self.verb} as failed, aborting the participants "
                "(Ctrl-C again to stop waiting)",
                file=sys.stderr,
                flush=True,
            )
            self.cancel.set()
        elif self.main is not None:
            self.main.cancel()  # stop waiting: the calls in flight end here, the leases end the rest


async def _run(args: argparse.Namespace, work: Work, interrupts: Interrupts) -> TransactionResult | None:
    """The transaction under the Ctrl-C handler; None when a second Ctrl-C stopped the wait."""
    loop = asyncio.get_running_loop()
    interrupts.main = asyncio.current_task()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, not POSIX
        loop.add_signal_handler(signal.SIGINT, interrupts)
    try:
        return await with_coordinator(args, lambda coordinator, state: work(coordinator, state, interrupts.cancel))
    except asyncio.CancelledError:
        if interrupts.count < 2:
            raise
        return None
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGINT)


def run_transaction(args: argparse.Namespace, verb: str, work: Work, again: str) -> int:
    """Run a checkpoint or restore against the stack and print its summary; 0 when completed. ``again`` is the
    command that repeats the same transaction."""
    interrupts = Interrupts(verb)
    abandoned = (
        f"each participant not aborted yet resumes on its own when its lease ends (--lease {args.lease:g}s; "
        f"`gymckpt status` shows them); `{again}` repeats the same {verb}"
    )
    try:
        result = asyncio.run(_run(args, work, interrupts))
    except (StackError, ParticipantError, StorageError) as exc:
        return fail(verb, exc)
    except OSError as exc:
        return fail(verb, StackError(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"))
    except KeyboardInterrupt:  # before the handler above was installed
        print(f"\ngymckpt {verb}: interrupted before the participants answered; {abandoned}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result is None:  # a second Ctrl-C while the first one's abort was under way
        print(f"gymckpt {verb}: stopped waiting for the abort; {abandoned}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(result.model_dump_json(indent=1) if args.json else transaction_summary(result))
    if interrupts.count and not result.completed:
        anew = (
            "`gymckpt checkpoint` takes a new one"
            if verb == "checkpoint"
            else f"`gymckpt restore {result.checkpoint_id}` restores it again"
        )
        print(
            f"gymckpt {verb}: interrupted; the {verb} failed and the participants resumed where they were; {anew}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0 if result.completed else 1
