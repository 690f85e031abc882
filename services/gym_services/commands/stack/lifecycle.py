"""``gymckpt up``, ``down``, ``restart`` and ``status``: the local stack's servers as processes."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gym_services.base.config import ConfigError
from gym_services.base.text import table
from gym_services.commands.stack.running import fail, plural, running, state_dir, stopped, with_coordinator
from gym_services.commands.stack.status_table import status_table
from gym_services.control.models import StatusResponse
from gym_services.coordination.client import ParticipantError
from gym_services.coordination.coordinator import Coordinator
from gym_services.stack.config import StackConfig, load_stack
from gym_services.stack.launcher import (
    StackError,
    StackState,
    is_running,
    partly_running,
    restart_server,
    start_missing,
    start_stack,
    stop_server,
    stop_stack,
)


def cmd_up(args: argparse.Namespace) -> int:
    try:
        stack = _stack(args)
        folder = stack.resolved_state_dir(Path.cwd())
        if partly_running(folder):  # a server crashed: start it again, the others keep their live state
            state, started = start_missing(folder, ready_timeout_s=args.timeout)
            print(
                f"started {', '.join(started)} again from {folder / 'configs'}; the other "
                f"{len(state.servers) - len(started)} servers of stack {state.name} kept running"
            )
            return 0
        state = start_stack(stack, Path.cwd(), ready_timeout_s=args.timeout, say=lambda text: print(text, flush=True))
    except (ConfigError, StackError) as exc:
        return fail("up", exc)
    _print_up(state)
    return 0


def _stack(args: argparse.Namespace) -> StackConfig:
    """The stack YAML with what the command line overrides (--state-dir, --storage)."""
    stack, _ = load_stack(args.config)
    if args.state_dir:
        stack.state_dir = args.state_dir
    if args.storage:
        try:
            stack = stack.model_validate({**stack.model_dump(), "storage": args.storage})
        except ValidationError:
            raise ConfigError(
                f"--storage must be embedded-s3, s3://bucket/prefix or file:///absolute/path, got {args.storage!r}"
            ) from None
    return stack


def _print_up(state: StackState) -> None:
    print(f"stack {state.name} is up ({len(state.servers)} servers); state in {state.state_dir}")
    print(
        table(
            ["server", "type", "url", "pid", "participant"],
            [[s.name, s.server, s.url, s.pid, s.participant] for s in state.servers]
            + [[s.name, "external", s.url, "", s.participant] for s in state.external],
        )
    )
    if state.object_store is not None:
        print(
            f"local S3 store (SeaweedFS) at {state.object_store.endpoint}, data in {state.object_store.data_dir}; "
            "`gymckpt down` stops it, the data stays"
        )
    print(f"checkpoints go to {state.storage}")


def cmd_restart(args: argparse.Namespace) -> int:
    """Stop one server of the running stack (if it still runs) and start it again from its saved config."""
    try:
        state = running(args)
        server = next((s for s in state.servers if s.name == args.name), None)
        if server is None:
            raise StackError(
                f"no server {args.name!r} in stack {state.name} (its servers: "
                f"{', '.join(s.name for s in state.servers)})"
            )
        if is_running(server):
            stop_server(server)
        restarted = restart_server(state_dir(args), args.name, ready_timeout_s=args.timeout)
    except StackError as exc:
        return fail("restart", exc)
    print(f"restarted {restarted.name} (pid {restarted.pid}) at {restarted.url}; log {restarted.log}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    try:
        names = stop_stack(state_dir(args), kill=args.kill)
    except StackError as exc:
        return fail("down", exc)
    if not names:
        print(f"nothing to stop: no server of the stack in {state_dir(args)} was running")
        return 0
    verb = "killed" if args.kill else "stopped"
    print(f"{verb} {len(names)} {plural(len(names), 'server')}: {', '.join(names)}")
    return 0


Statuses = dict[str, StatusResponse | ParticipantError]


def cmd_status(args: argparse.Namespace) -> int:
    """Every participant's state; exits 1 when a server of the stack is not running (or does not answer)."""

    async def work(coordinator: Coordinator, state: StackState) -> tuple[Statuses, list[str]]:
        return await coordinator.status(), stopped(state)

    try:
        statuses, down = asyncio.run(with_coordinator(args, work, running_only=True))
    except (StackError, ParticipantError) as exc:
        return fail("status", exc)
    if args.json:
        answer = {pid: _status_json(pid, s) for pid, s in statuses.items()}
        answer.update({name: {"participant_id": name, "error": "not running"} for name in down})
        print(json.dumps(answer, indent=1))
    else:
        print(status_table(statuses, down, wide=args.wide))
    unreachable = [pid for pid, s in statuses.items() if isinstance(s, ParticipantError)]
    if down or unreachable:
        what = "; ".join(
            part
            for part in (
                f"not running: {', '.join(down)}" if down else "",
                f"not answering: {', '.join(unreachable)}" if unreachable else "",
            )
            if part
        )
        print(
            f"gymckpt status: {what}; `gymckpt up CONFIG` starts what is missing while the rest keeps running "
            f"(their logs: {state_dir(args) / 'logs'})",
            file=sys.stderr,
        )
        return 1
    return 0


def _status_json(pid: str, status: StatusResponse | ParticipantError) -> dict[str, Any]:
    if isinstance(status, ParticipantError):
        return {"participant_id": pid, "error": status.reason}
    return status.model_dump(mode="json")
