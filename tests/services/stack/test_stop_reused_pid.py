"""Stopping a stack never signals a process that only inherited a dead server's pid.

A server that died (SIGKILLed by a test or a chaos run, crashed) stays in the stack's state file; pids wrap (at
32768 on this machine) and are handed out again, often to another process group leader - another stack's server
or an object store. ``stop_stack`` killed the process group of every recorded pid that was alive: seen as two
agents of a chaos run's stack dying at once mid-checkpoint (ReadError) while another run stopped its stacks."""

from __future__ import annotations

import subprocess
import sys

from gym_services.stack.launcher import STATE_FILE, RunningServer, StackState, is_running, start_time, stop_stack


def test_a_reused_pid_is_not_ours_to_kill(tmp_path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = start_time(stranger.pid)
        assert started is not None
        dead = RunningServer(
            name="agent",
            server="simple_agent",
            url="http://127.0.0.1:1",
            port=1,
            pid=stranger.pid,
            participant=True,
            log=str(tmp_path / "agent.log"),
            started=started - 1,
        )  # an older process
        state = StackState(name="old", state_dir=str(tmp_path), storage=f"file://{tmp_path}", servers=[dead])
        (tmp_path / STATE_FILE).write_text(state.model_dump_json())
        assert not is_running(dead)
        assert stop_stack(tmp_path, kill=True) == []
        assert stranger.poll() is None  # still running: not the server that pid once was
        # the same pid recorded with its own start time is the server: stopped
        (tmp_path / STATE_FILE).write_text(
            state.model_copy(update={"servers": [dead.model_copy(update={"started": started})]}).model_dump_json()
        )
        assert stop_stack(tmp_path, kill=True) == ["agent"]
        stranger.wait(timeout=10)  # (stop_stack may have reaped it already)
        assert start_time(stranger.pid) is None
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()
