"""The running local stack as every command sees it: its state folder, which servers run, a coordinator over
its participants, and the one-line failure a command ends with."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from gym_services.commands.stack.storage import storage_config
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import StackError, StackState, is_running, read_state, stack_secrets

T = TypeVar("T")


def state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir).resolve()


def fail(prefix: str, exc: Exception) -> int:
    """``gymckpt PREFIX: what went wrong; the next step`` on stderr, exit 1."""
    print(f"gymckpt {prefix}: {exc}", file=sys.stderr)
    return 1


def plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"


def running(args: argparse.Namespace) -> StackState:
    """The stack's state, refused with the next step when none of its servers runs (after `down`)."""
    state = read_state(state_dir(args))
    if not any(is_running(s) for s in state.servers):
        raise StackError(
            f"the stack {state.name} is not running (its {len(state.servers)} servers have stopped); "
            "start it with `gymckpt up CONFIG`"
        )
    return state


def stopped(state: StackState) -> list[str]:
    """The participants of the stack whose process is gone."""
    return [s.name for s in state.participants() if not is_running(s)]


async def with_coordinator(
    args: argparse.Namespace,
    work: Callable[[Coordinator, StackState], Awaitable[T]],
    *,
    running_only: bool = False,
) -> T:
    """Run ``work`` with a coordinator over the stack's participants; every one must run, unless
    ``running_only`` (status: the stopped ones are reported, not asked)."""
    state = running(args)
    down = stopped(state)
    if down and not running_only:
        raise StackError(
            f"not running: {', '.join(down)}; a checkpoint or restore needs every participant "
            "(`gymckpt up CONFIG` starts what is missing while the rest keeps running)"
        )
    asked = state.model_copy(update={"servers": [s for s in state.servers if s.name not in down]})
    token = stack_secrets(state_dir(args))["control_token"]
    async with ControlClient(token, timeout_s=args.timeout) as client:
        participants = await discover(asked, client)

        def progress(phase: str, detail: dict[str, Any]) -> None:
            if not getattr(args, "quiet", False):
                print(
                    f"  {time.strftime('%H:%M:%S')} {phase.lower()}",
                    flush=True,
                    file=sys.stderr if getattr(args, "json", False) else sys.stdout,
                )

        coordinator = Coordinator(participants, client, storage_config=storage_config(args, state), on_event=progress)
        return await work(coordinator, state)
