"""Starting a local stack's supervisor, and stopping a supervised stack with its final checkpoint.

``gymckpt up`` starts the supervisor (:mod:`gym_services.stack.supervisor`) once every server is ready and the stack
is resumed (:mod:`gym_services.stack.resume`); ``gymckpt down`` calls :func:`terminate_stack`, which is what a
preemption does to every server: SIGTERM. The supervisor sees it, takes the final checkpoint within the grace, and
stops everything. A stack whose supervisor is not running (it was killed) gets its final checkpoint from the caller
instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gym_services.stack import children
from gym_services.stack.history import Termination, read_history
from gym_services.stack.launcher import (
    StackError,
    StackState,
    SupervisorProcess,
    is_running,
    read_state,
    start_time,
    stop_stack,
    write_state,
)

#: how long the supervisor may take to start answering for itself (its log says what went wrong otherwise)
SUPERVISOR_START_S = 10.0


def start_supervisor(state_dir: Path, env: dict[str, str] | None = None) -> SupervisorProcess:
    """Start the stack's supervisor in its own session (recorded in the state file). A supervisor a killed stack
    left behind is killed first: it would take checkpoints of servers that are no more. ``env`` is added to its
    environment (how it reaches storage, as the servers do: ``AWS_*``)."""
    state = read_state(state_dir)
    if state.checkpoint is None:
        raise StackError(f"stack {state.name} was not started to be supervised (start_stack(..., supervise=True))")
    if state.supervisor is not None and is_running(state.supervisor):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.supervisor.pid, signal.SIGKILL)
    log_path = state_dir / "logs" / "supervisor.log"
    with open(log_path, "ab") as log:  # the child has its own copy of the file
        proc = children.keep(
            subprocess.Popen(
                [sys.executable, "-m", "gym_services.stack.supervisor", str(state_dir)],
                env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    supervisor = SupervisorProcess(pid=proc.pid, started=start_time(proc.pid), log=str(log_path))
    write_state(state.model_copy(update={"supervisor": supervisor}))
    _wait_started(proc, log_path)
    return supervisor


def _wait_started(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until the supervisor logged that it supervises (a bad state folder ends it at once: say why)."""
    deadline = time.monotonic() + SUPERVISOR_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-800:]
            raise StackError(f"the stack's supervisor exited at start ({proc.returncode}); its log ends:\n{tail}")
        with contextlib.suppress(OSError):
            if '"supervising"' in log_path.read_text(errors="replace"):
                return
        time.sleep(0.05)


@dataclass
class Stopped:
    """What :func:`terminate_stack` did: the servers that were running, and the termination's record."""

    servers: list[str]
    termination: Termination | None
    supervised: bool


def terminate_stack(state_dir: Path) -> Stopped:
    """SIGTERM every server of the stack, as a preemption would: the supervisor takes the final checkpoint within
    the grace and stops them all. Returns once everything exited (bounded by the grace). Without a running
    supervisor, the final checkpoint is taken here."""
    state = read_state(state_dir)
    running = [server for server in state.servers if is_running(server)]
    supervised = state.supervisor is not None and is_running(state.supervisor)
    if not supervised:
        return Stopped([s.name for s in running], _final_here(state, state_dir), supervised=False)
    for server in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
    grace = state.checkpoint.termination_grace if state.checkpoint is not None else 30.0
    assert state.supervisor is not None
    deadline = time.monotonic() + grace + 15.0  # the supervisor itself waits the grace and the drain at most
    while is_running(state.supervisor) and time.monotonic() < deadline:
        children.reap(state.supervisor.pid)
        time.sleep(0.05)
    stop_stack(state_dir, kill=True, timeout_s=1.0)  # whatever the supervisor could not stop (normally nothing)
    history = read_history(state_dir)
    return Stopped([s.name for s in running], history.termination if history else None, supervised=True)


def _final_here(state: StackState, state_dir: Path) -> Termination | None:
    """A supervised stack whose supervisor is gone: its final checkpoint from this process, then every server stops.
    An unsupervised one (started without a supervisor) just stops."""
    if state.checkpoint is None or not any(is_running(s) for s in state.servers):
        stop_stack(state_dir)
        return None
    from gym_services.stack.supervisor import Supervisor  # the same steps the supervisor takes

    supervisor = Supervisor(state_dir)
    now, grace = time.time(), state.checkpoint.termination_grace
    supervisor.signalled_by_caller(now, grace)
    asyncio.run(supervisor.run())
    stop_stack(state_dir, kill=True, timeout_s=1.0)
    history = read_history(state_dir)
    return history.termination if history else None
