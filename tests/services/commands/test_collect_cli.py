"""`gymckpt collect` as a new user meets it: nothing overwritten, tasks-file mistakes named before anything is
written, a job whose every episode failed exits non-zero, Ctrl-C says the job keeps running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.services.commands.cli_support import gymckpt

TASK = '{"agent": "ghost", "responses_create_params": {"input": "hi"}}\n'


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Path:
    """A collection server whose only agent is unreachable, giving up on an episode after half a second."""
    folder = tmp_path_factory.mktemp("collect")
    (folder / "stack.yaml").write_text(
        "name: ghost\nservers:\n  collection: {server: collection, config: {agents: {ghost: 'http://127.0.0.1:9'}, "
        "unavailable_backoff_s: 0.05, unavailable_backoff_max_s: 0.1, unavailable_deadline_s: 0.5, job_dirs: ['.']}}\n"
    )
    gymckpt("up", "stack.yaml", cwd=folder)
    yield folder
    gymckpt("down", "--kill", cwd=folder, check=False)


def _job(folder: Path) -> dict:
    state = json.loads((folder / ".gymckpt/stack/stack.json").read_text())
    token = json.loads((folder / ".gymckpt/stack/secrets.json").read_text())["control_token"]
    answer = httpx.get(
        f"{state['servers'][0]['url']}/jobs/current", headers={"authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_earlier_results_are_never_overwritten_unless_asked(stack) -> None:
    (stack / "tasks.jsonl").write_text(TASK)
    earlier = b'{"agent": "a", "reward": 1.0}\n' * 20
    (stack / "results.jsonl").write_bytes(earlier)
    refused = gymckpt("collect", "tasks.jsonl", cwd=stack, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        "gymckpt collect: results.jsonl already holds 600 B of results (an earlier job's; a checkpoint of that job "
        "needs them to restore); choose another file with --output, or replace it with --overwrite\n"
    )
    assert (stack / "results.jsonl").read_bytes() == earlier
    assert _job(stack)["state"] == "idle"  # no job started

    (stack / "empty.jsonl").write_text("\n\n")
    empty = gymckpt("collect", "empty.jsonl", "--output", "new.jsonl", cwd=stack, check=False)
    assert empty.returncode == 1
    assert (
        empty.stderr
        == "gymckpt collect: empty.jsonl holds no task (one JSON object a line); nothing was started or written\n"
    )
    assert not (stack / "new.jsonl").exists() and _job(stack)["state"] == "idle"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no tasks file missing.jsonl (relative paths are relative to "),
        (
            '{"responses_create_params": {"input": [1, 2,]}}\n',
            "bad.jsonl, line 1, column 45: not JSON (Expecting value)",
        ),
        (
            TASK + '{"agent": "ghost", "prompt": "hi"}\n',
            "bad.jsonl, line 2: the task has no responses_create_params object",
        ),
        ("[1, 2]\n", "bad.jsonl, line 1: a task must be a JSON object, not list"),
    ],
)
def test_tasks_file_mistakes_are_named_before_a_job_starts(stack, content, message) -> None:
    name = "missing.jsonl" if content is None else "bad.jsonl"
    if content is not None:
        (stack / name).write_text(content)
    proc = gymckpt("collect", name, "--output", "never.jsonl", cwd=stack, check=False)
    assert proc.returncode == 1 and proc.stderr.startswith(f"gymckpt collect: {message}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert not (stack / "never.jsonl").exists() and _job(stack)["state"] == "idle"


def test_a_job_whose_every_episode_failed_exits_1_and_overwrite_replaces(stack) -> None:
    (stack / "tasks.jsonl").write_text(TASK * 2)
    (stack / "failed.jsonl").write_text("old results\n")
    proc = gymckpt("collect", "tasks.jsonl", "--output", "failed.jsonl", "--overwrite", cwd=stack, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout.startswith("collected 2 rollouts (2 errors); mean reward -; results in ")
    assert "gymckpt collect: every episode failed; the first error is in " in proc.stderr
    rows = [json.loads(line) for line in (stack / "failed.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("gave up after" in row["error"] for row in rows)


def test_a_tasks_file_outside_the_servers_folders_names_job_dirs(stack, tmp_path) -> None:
    (tmp_path / "tasks.jsonl").write_text(TASK)
    proc = gymckpt("collect", str(tmp_path / "tasks.jsonl"), "--output", "outside.jsonl", cwd=stack, check=False)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "is outside the folders this server may use" in proc.stderr
    assert proc.stderr.rstrip().endswith("move it into one of them, or add its folder to the server's job_dirs")


@pytest.mark.skipif(os.name != "posix", reason="SIGINT is how Ctrl-C reaches a process")
def test_ctrl_c_while_following_says_the_job_keeps_running(stack) -> None:
    (stack / "tasks.jsonl").write_text(TASK)
    # the job stays live for minutes: its agent is down and this job's episodes wait longer than the test runs
    state = json.loads((stack / ".gymckpt/stack/stack.json").read_text())
    url = state["servers"][0]["url"]
    deadline = time.monotonic() + 60
    while _job(stack)["state"] not in ("idle", "completed") and time.monotonic() < deadline:
        time.sleep(0.1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gym_services.cli",
            "collect",
            "tasks.jsonl",
            "--output",
            "followed.jsonl",
            "--repeats",
            "10000",
            "--concurrency",
            "1",
        ],
        cwd=stack,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GYMCKPT_STATE_DIR": str(stack / ".gymckpt/stack")},
        # as in a terminal: a suite started in the background by a non-interactive shell (CI) inherits SIGINT
        # ignored, and Python then never turns Ctrl-C into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        while _job(stack)["state"] != "running" and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)  # following by now
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1] == (
        f"gymckpt collect: stopped following; the job keeps running on {url}: "
        "`gymckpt collect --attach` follows it again"
    )
    assert _job(stack)["state"] == "running"
