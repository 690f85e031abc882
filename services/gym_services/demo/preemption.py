"""The demo's two stories of a stack that checkpoints itself (``gymckpt demo``), beside its uninterrupted run.

Both run the demo stack with a supervisor and a schedule (:mod:`gym_services.stack.supervisor`), as ``gymckpt up``
does, and both bring it back as ``gymckpt up`` does: fresh processes, then the automatic resume
(:mod:`gym_services.stack.resume`). Nobody types a checkpoint command.

- :func:`crashed`: every process SIGKILLed with no warning once ``checkpoint_at`` of the rollouts finished. The stack
  resumes from its newest scheduled checkpoint; the work since then is done again, and the schedule bounds it.
- :func:`preempted`: SIGTERM to every server, as a node preemption sends it. The stack takes its final checkpoint
  within the grace and exits; it resumes from that checkpoint, and no token is generated twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from gym_services.demo.story import (
    MODEL,
    Run,
    Story,
    StoryError,
    freeze_ledgers,
    kill_process,
    model_status,
    model_tokens,
    read_results,
    wait_job,
)
from gym_services.stack.history import read_history
from gym_services.stack.launcher import RunningServer, StackState, SupervisorProcess, is_running, stop_stack
from gym_services.stack.resume import resume_stack
from gym_services.stack.schedule import CheckpointSettings
from gym_services.stack.supervision import start_supervisor

#: the demo's schedule: short, so that a crash a few seconds into the run finds a checkpoint to resume from
DEMO_EVERY_S = 3.0
#: the preemption's grace: GKE's notice for spot nodes
DEMO_GRACE_S = 30.0


def settings(every_s: float = DEMO_EVERY_S, grace_s: float = DEMO_GRACE_S) -> CheckpointSettings:
    return CheckpointSettings(every=every_s, keep=3, termination_grace=grace_s)


def _up(story: Story, name: str, run: Run, checkpoint: CheckpointSettings) -> StackState:
    """The stack ``name`` with its supervisor, resumed as ``gymckpt up`` resumes it (nothing to resume at first)."""
    state = story.start(name, checkpoint=checkpoint)
    resumed = asyncio.run(resume_stack(state, storage_config=story.storage_config))
    if resumed.checkpoint is not None:
        run.restore, run.resumed_line = resumed.result, resumed.line
        story.say(f"  {resumed.line}")
    start_supervisor(Path(state.state_dir), env=story.server_env)
    return state


def _finish(story: Story, state: StackState, run: Run, output: Path, label: str) -> None:
    """After the resume: a late call of an old attempt, the job to its end, the results, tokens and ledgers."""
    if run.restore is not None and run.restore.episodes:
        run.stale_call = asyncio.run(story.late_call(state, run.restore.episodes))
    asyncio.run(wait_job(state, story.timeout_s, story.bar(label)))
    models = model_status(state)
    run.tokens_after_restore = model_tokens(models)
    run.tokens_reused = sum(int(live.get("tokens_reused", 0)) for live in models.values())
    read_results(output, run)
    run.ledgers = asyncio.run(freeze_ledgers(state.urls(MODEL), sorted(run.results)))


def crashed(story: Story, checkpoint: CheckpointSettings | None = None, crash_after_s: float = 1.0) -> Run:
    """SIGKILL of every process (and the supervisor) once ``checkpoint_at`` of the rollouts finished and the schedule
    published a checkpoint ``crash_after_s`` ago or more; fresh processes resume from the newest scheduled
    checkpoint."""
    run = Run()
    checkpoint = checkpoint or settings()
    output = story.workdir / "crashed.jsonl"
    state_dir = story.workdir / "crashed"
    state = _up(story, "crashed", run, checkpoint)
    try:
        started = time.perf_counter()
        story.submit(state, output)
        bar = story.bar("crashed")
        if story.kill_worker_at is not None:
            story.wait_for_progress(state, story.timeout_s, share=story.kill_worker_at, bar=bar)
            run.worker_killed = story.kill_worker(state)
        story.wait_for_progress(state, story.timeout_s, bar=bar)
        _wait_after_checkpoint(state_dir, story.timeout_s, crash_after_s)
        if state.supervisor is not None:
            kill_process(state.supervisor.pid)
        run.tokens_before_cut = story.crash(state)  # every token this stack received, lost ones included
        run.crashed_at = time.time()
    finally:
        stop_stack(state_dir, kill=True)
    history = read_history(state_dir)
    run.newest = history.last_successful() if history is not None else None
    taken = len(history.kept) if history is not None else 0
    story.say(f"  killed every process with SIGKILL; the schedule had taken {taken} checkpoints")
    state = _up(story, "crashed", run, checkpoint)
    try:
        _finish(story, state, run, output, "crashed, resumed")
        run.duration_s = time.perf_counter() - started
    finally:
        stop_stack(state_dir)
    return run


def _wait_after_checkpoint(state_dir: Path, timeout_s: float, after_s: float) -> None:
    """Until the schedule published a checkpoint (the crash must have something to resume from), and ``after_s``
    passed since (the crash then costs work, as a crash at any moment does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        history = read_history(state_dir)
        newest = history.last_successful() if history is not None else None
        if newest is not None and time.time() - (newest.ended_at or newest.started_at) >= after_s:
            return
        if time.monotonic() > deadline:
            raise StoryError(f"the stack's schedule published no checkpoint within {timeout_s:.0f}s")
        time.sleep(0.02)


def preempted(story: Story, checkpoint: CheckpointSettings | None = None) -> Run:
    """SIGTERM to every server once ``checkpoint_at`` of the rollouts finished; the stack checkpoints itself and exits,
    fresh processes resume from its final checkpoint."""
    run = Run()
    checkpoint = checkpoint or settings()
    output = story.workdir / "preempted.jsonl"
    state_dir = story.workdir / "preempted"
    state = _up(story, "preempted", run, checkpoint)
    try:
        started = time.perf_counter()
        story.submit(state, output)
        story.wait_for_progress(state, story.timeout_s, bar=story.bar("preempted"))
        for server in state.servers:  # no checkpoint command: a signal, as a preempted node's pods get it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
        _wait_exited(state, checkpoint.termination_grace + 30)
    finally:
        stop_stack(state_dir, kill=True)
    history = read_history(state_dir)
    termination = history.termination if history is not None else None
    if termination is None or termination.outcome != "published" or termination.final is None:
        raise StoryError(f"the final checkpoint was not published: {termination.error if termination else 'none'}")
    run.termination = termination
    run.in_flight = exit_counts(state_dir)
    run.exit_counters = exit_counters(state_dir)
    run.tokens_before_cut = model_tokens(run.in_flight)
    story.say(
        f"  SIGTERM to every server: final checkpoint {termination.final.checkpoint_id} published "
        f"{termination.signal_to_published_s:.2f} s after the signal; every process exited"
    )
    state = _up(story, "preempted", run, checkpoint)
    try:
        _finish(story, state, run, output, "preempted, resumed")
        run.duration_s = time.perf_counter() - started
    finally:
        stop_stack(state_dir)
    return run


def _wait_exited(state: StackState, timeout_s: float) -> None:
    processes: list[RunningServer | SupervisorProcess] = [*state.servers]
    if state.supervisor is not None:
        processes.append(state.supervisor)
    deadline = time.monotonic() + timeout_s
    while any(is_running(p) for p in processes):
        if time.monotonic() > deadline:
            raise StoryError(f"the stack had not exited {timeout_s:.0f}s after SIGTERM")
        time.sleep(0.02)


def exit_counts(state_dir: Path) -> dict[str, dict[str, Any]]:
    """Participant id -> the live counts its last log line said it held when it exited (a participant that exits
    after its part of a final checkpoint logs them: what it held at the cut)."""
    return {name: line["live"] for name, line in _exit_lines(state_dir).items() if isinstance(line.get("live"), dict)}


def exit_counters(state_dir: Path) -> dict[str, dict[str, float]]:
    """Process name -> the counters of its metrics when it exited (what it did in its life: steps, tool calls)."""
    return {
        name: line["counters"]
        for name, line in _exit_lines(state_dir).items()
        if isinstance(line.get("counters"), dict)
    }


def _exit_lines(state_dir: Path) -> dict[str, dict[str, Any]]:
    """Process name -> the last ``exiting`` line of its log."""
    lines: dict[str, dict[str, Any]] = {}
    for log in sorted((state_dir / "logs").glob("*.log")):
        with contextlib.suppress(OSError, ValueError):
            found = [line for line in log.read_text().splitlines() if '"msg": "exiting"' in line]
            if found:
                lines[log.stem] = json.loads(found[-1])
    return lines
