"""The local stack checking itself, through the CLI on a one-server stack: `up` starts the supervisor and the
schedule, `down` takes the final checkpoint (`--no-checkpoint`, `--kill` do not), `up` resumes by itself and says
from what (`--fresh` does not), `status` shows the schedule; settings that cannot work are refused before anything
starts."""

from __future__ import annotations

import json
import time

import pytest
from tests.services.commands.cli_support import gymckpt

from gym_services.stack.history import StackHistory, TakenCheckpoint, Termination, write_history

STACK = "name: one\nstate_dir: .gymckpt/stack\nservers:\n  counter-a: {server: counter}\n"


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "stack.yaml").write_text(STACK)
    yield tmp_path
    gymckpt("down", "--kill", cwd=tmp_path, check=False)


def _history(folder) -> dict:
    return json.loads((folder / ".gymckpt/stack/history.json").read_text())


def test_down_checkpoints_and_up_resumes(folder) -> None:
    up = gymckpt("up", "stack.yaml", "--checkpoint-every", "1s", "--keep", "2", cwd=folder).stdout
    assert "the stack checkpoints itself: every 1s, keep 2, termination grace 30s" in up
    log = folder / ".gymckpt/stack/logs/supervisor.log"
    deadline = time.monotonic() + 30
    while '"deleted beyond keep"' not in log.read_text() and time.monotonic() < deadline:  # the schedule, and keep
        time.sleep(0.1)
    assert '"deleted beyond keep"' in log.read_text()
    status = gymckpt("status", cwd=folder).stdout
    assert "schedule: every 1s, keep 2, termination grace 30s; supervisor pid" in status
    assert "last successful: sched-" in status and "next checkpoint: in" in status

    down = gymckpt("down", cwd=folder).stdout.splitlines()
    assert down[0] == "stopped 1 server: counter-a"
    history = _history(folder)
    final = history["termination"]["final"]["checkpoint_id"]
    assert [c["kind"] for c in history["kept"]] == ["scheduled", "final"]  # keep 2, the final one too
    assert down[1].startswith(f"final checkpoint {final} published ") and "`gymckpt up` resumes from it" in down[1]
    resumed = gymckpt("up", "stack.yaml", cwd=folder).stdout
    assert f"resumed automatically from {final}, the checkpoint the stack took on counter-a's SIGTERM" in resumed

    gymckpt("down", "--kill", cwd=folder)  # a crash: no checkpoint; the next up takes the newest scheduled one
    newest = _history(folder)["kept"][-1]["checkpoint_id"]
    resumed = gymckpt("up", "stack.yaml", cwd=folder).stdout
    assert f"resumed automatically from {newest}" in resumed and "(a crash, SIGKILL)" in resumed

    assert gymckpt("down", "--no-checkpoint", cwd=folder).stdout == "stopped 1 server: counter-a\n"
    fresh = gymckpt("up", "stack.yaml", "--fresh", cwd=folder).stdout
    assert "started fresh (--fresh)" in fresh and "resumed automatically" not in fresh


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--checkpoint-every", "100ms"], "--checkpoint-every: every 100ms is shorter than a checkpoint takes"),
        (["--keep", "0"], "--keep: keep 0 would delete every checkpoint the schedule takes"),
        (["--termination-grace", "1s"], "--termination-grace: termination_grace 1s leaves no time"),
        (["--checkpoint-every", "soon"], "--checkpoint-every: 'soon' is not a duration"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_anything_starts(folder, flags, message) -> None:
    refused = gymckpt("up", "stack.yaml", *flags, cwd=folder, check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("gymckpt up: ") and message in refused.stderr
    assert not (folder / ".gymckpt/stack/stack.json").exists()  # nothing started


def test_a_grace_shorter_than_this_stacks_final_checkpoint_took_is_refused(folder) -> None:
    (folder / ".gymckpt/stack").mkdir(parents=True)
    taken = TakenCheckpoint(checkpoint_id="final-1", kind="final", started_at=0.0, status="completed")
    write_history(
        folder / ".gymckpt/stack",
        StackHistory(
            termination=Termination(
                signalled_at=0.0, deadline_at=30.0, signalled=["counter-a"], final=taken, signal_to_published_s=6.5
            )
        ),
    )
    refused = gymckpt("up", "stack.yaml", "--termination-grace", "5s", cwd=folder, check=False)
    assert refused.returncode == 1
    assert "termination grace 5s is shorter than its final checkpoint took (signal to published) on this stack" in (
        refused.stderr
    )
    assert "give at least 8s" in refused.stderr
    assert not (folder / ".gymckpt/stack/stack.json").exists()
