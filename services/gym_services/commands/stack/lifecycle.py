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
from gym_services.base.text import human_seconds, table
from gym_services.commands.stack.running import fail, plural, running, state_dir, stopped, with_coordinator
from gym_services.commands.stack.schedule_view import schedule_lines
from gym_services.commands.stack.status_table import status_table
from gym_services.control.models import StatusResponse
from gym_services.coordination.client import ParticipantError
from gym_services.coordination.coordinator import Coordinator
from gym_services.stack.config import StackConfig, load_stack
from gym_services.stack.history import read_history, refuse_settings
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
from gym_services.stack.resume import resume_stack
from gym_services.stack.schedule import CheckpointSettings
from gym_services.stack.supervision import Stopped, start_supervisor, terminate_stack


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
            if state.checkpoint is not None and (state.supervisor is None or not is_running(state.supervisor)):
                start_supervisor(folder)
                print("started the stack's supervisor again")
            return 0
        refuse_settings(stack.checkpoint, read_history(folder))
        state = start_stack(
            stack, Path.cwd(), ready_timeout_s=args.timeout, say=lambda text: print(text, flush=True), supervise=True
        )
    except (ConfigError, StackError) as exc:
        return fail("up", exc)
    try:
        resumed = asyncio.run(resume_stack(state, fresh=args.fresh))
        start_supervisor(folder)
    except (StackError, ParticipantError) as exc:
        stop_stack(folder)
        return fail("up", exc)
    _print_up(state)
    if resumed.line:
        print(resumed.line)
    return 0


def _stack(args: argparse.Namespace) -> StackConfig:
    """The stack YAML with what the command line overrides (--state-dir, --storage, the checkpoint settings)."""
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
    given = {
        "every": args.checkpoint_every,
        "keep": args.keep,
        "termination_grace": args.termination_grace,
    }
    flags = {"every": "--checkpoint-every", "keep": "--keep", "termination_grace": "--termination-grace"}
    overrides = {key: value for key, value in given.items() if value is not None}
    if overrides:
        try:
            stack.checkpoint = CheckpointSettings.model_validate({**stack.checkpoint.model_dump(), **overrides})
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            field = str(error["loc"][0]) if error["loc"] else ""
            raise ConfigError(f"{flags.get(field, field)}: {error['msg'].removeprefix('Value error, ')}") from None
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
    if state.checkpoint is not None:
        log = Path(state.state_dir) / "logs" / "supervisor.log"
        print(
            f"the stack checkpoints itself: {state.checkpoint.describe()} (`gymckpt status` shows the schedule, "
            f"`gymckpt down` takes the final checkpoint; supervisor log {log})"
        )


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
    """SIGTERM every server (the supervisor takes the final checkpoint), or stop without one."""
    folder = state_dir(args)
    try:
        if args.kill or args.no_checkpoint:
            names, done = stop_stack(folder, kill=args.kill), None
        else:
            done = terminate_stack(folder)
            names = done.servers
    except StackError as exc:
        return fail("down", exc)
    if not names:
        print(f"nothing to stop: no server of the stack in {folder} was running")
        return 0
    verb = "killed" if args.kill else "stopped"
    print(f"{verb} {len(names)} {plural(len(names), 'server')}: {', '.join(names)}")
    if done is None:
        return 0
    return _report_final(folder, done)


def _report_final(folder: Path, done: Stopped) -> int:
    """The final checkpoint's outcome in one line (exit 1 when it failed)."""
    termination = done.termination
    if termination is None:
        print("no final checkpoint: the stack was started without a supervisor (`gymckpt up` starts one)")
        return 0
    final = termination.final
    if termination.outcome == "published" and final is not None:
        print(
            f"final checkpoint {final.checkpoint_id} published {human_seconds(termination.signal_to_published_s or 0)} "
            f"after the signal ({final.episodes} live episodes); `gymckpt up` resumes from it"
        )
        return 0
    history = read_history(folder)
    newest = history.last_successful() if history is not None else None
    resume = (
        f"`gymckpt up` resumes from {newest.checkpoint_id}, "
        f"{human_seconds(termination.signalled_at - (newest.ended_at or newest.started_at))} older"
        if newest is not None
        else "there is no earlier checkpoint: `gymckpt up` starts empty"
    )
    print(f"gymckpt down: the final checkpoint failed ({termination.error}); {resume}", file=sys.stderr)
    return 1


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
        schedule = schedule_lines(state_dir(args))
        if schedule:
            print("\n".join(schedule))
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
