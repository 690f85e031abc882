"""`gymckpt status` fits a terminal and says when a server is down (exit 1); `gymckpt up` starts a crashed
server again while the others keep their live state, `gymckpt restart NAME` restarts one, and then
checkpoint works; `collect` names the server that is down when a job stalls."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from tests.services.commands.cli_support import gymckpt

from gym_services.commands.stack.status_table import WIDTH, status_table
from gym_services.control.models import StatusResponse


def _status(participant: str, **update) -> StatusResponse:
    base = {
        "participant_id": participant,
        "server": participant,
        "role": "model",
        "checkpoint_mode": "exported",
        "checkpoint_verify": "wait",
        "phase": "open",
        "checkpoint_id": None,
        "lease_remaining_s": None,
        "admission_open": True,
        "inflight": 0,
        "blockers": [],
        "last_event": None,
        "persist": None,
        "live": {
            "generations": 3,
            "cut": 0,
            "tokens_generated": 2472,
            "worker_states": {
                f"http://127.0.0.1:{port}/v1": {"healthy": True, "streams": 0, "last_error": None}
                for port in range(4000, 4016)
            },
        },
    }
    return StatusResponse.model_validate({**base, **update})


def test_the_status_table_fits_120_columns_and_says_serving() -> None:
    blockers = [{"kind": "episode", "id": f"r{i}", "detail": "waiting for the model " * 4} for i in range(5)]
    idle = {
        "policy-model-with-a-long-name": _status("policy-model-with-a-long-name", blockers=blockers),
        "counter": _status("counter", role="resources", phase="fresh", live={"sessions": 2}),
    }
    text = status_table(idle, ["crashed"])
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert rows["counter"][:4] == ["counter", "resources", "serving", "sessions=2"]
    assert rows["policy-model-with-a-long-name"][2:5] == ["serving", "generations=3,", "tokens_generated=2472"]
    assert "blockers" not in text.splitlines()[0]  # no checkpoint open: a blocker count would mean nothing
    assert rows["crashed"][:4] == ["crashed", "?", "not", "running"]
    assert "worker_states" not in text and "{" not in text

    held = {
        pid: s.model_copy(
            update={"checkpoint_id": "ckpt-20261202-044028-15bad7", "phase": "preparing", "admission_open": False}
        )
        for pid, s in idle.items()
    }
    held["counter"] = held["counter"].model_copy(update={"phase": "prepared"})
    text = status_table(held, [])
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert text.splitlines()[0].split() == ["participant", "role", "state", "live", "checkpoint", "blockers"]
    row = next(line.split() for line in text.splitlines() if line.startswith("policy-model"))
    assert row[2] == "preparing" and row[-2:] == ["ckpt-20261202-044028-15bad7", "5"]
    assert "checkpoint ckpt-20261202-044028-15bad7: preparing on 1 of 2 participants" in text

    done = {
        pid: StatusResponse.model_validate(
            {
                **s.model_dump(),
                "last_event": "resume ck1",
                "persist": {"checkpoint_id": "ck1", "state": "failed", "records": 7, "error": "disk full"},
            }
        )
        for pid, s in idle.items()
    }
    text = status_table(done, [])
    assert "last checkpoint upload ck1: failed on 2 of 2 participants; 14 records; error: disk full" in text
    assert "last event: resume ck1" in text
    wide = status_table(done, [], wide=True)
    assert "worker_states=16" in wide and "ck1 failed 7 records: disk full" in wide


@pytest.fixture
def stack(tmp_path) -> Path:
    (tmp_path / "stack.yaml").write_text(
        "name: mini\nservers:\n  counter-a: {server: counter}\n  counter-b: {server: counter}\n"
        "  collection: {server: collection, config: {agents: {ghost: 'http://127.0.0.1:9'}, "
        "unavailable_backoff_max_s: 0.2, job_dirs: ['.']}}\n"
    )
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    yield tmp_path
    gymckpt("down", "--kill", cwd=tmp_path, check=False)


def _servers(folder: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((folder / ".gymckpt/stack/stack.json").read_text())["servers"]}


def _kill(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_a_crashed_server_is_started_again_by_up_while_the_rest_keeps_running(stack) -> None:
    servers = _servers(stack)
    with httpx.Client(base_url=servers["counter-b"]["url"]) as http:
        http.post("/seed_session", json={"start": 41}, headers={"x-ng-rollout-id": "r1"})
        cookies = dict(http.cookies)
    _kill(servers["counter-a"]["pid"])

    status = gymckpt("status", cwd=stack, check=False)
    assert status.returncode == 1
    assert [line.split()[:4] for line in status.stdout.splitlines() if line.startswith("counter-a")] == [
        ["counter-a", "?", "not", "running"]
    ]
    assert status.stderr.startswith(
        "gymckpt status: not running: counter-a; `gymckpt up CONFIG` starts what is missing"
    )
    refused = gymckpt("checkpoint", cwd=stack, check=False)
    assert refused.returncode == 1 and "`gymckpt up CONFIG` starts what is missing" in refused.stderr

    (stack / "tasks.jsonl").write_text('{"agent": "ghost", "responses_create_params": {"input": "hi"}}\n')
    stalled = gymckpt("collect", "tasks.jsonl", "--stall-warning", "1", "--wait-timeout", "3", cwd=stack, check=False)
    assert stalled.returncode == 1
    assert "not running: counter-a (`gymckpt up CONFIG` starts it again)" in stalled.stderr

    up = gymckpt("up", "stack.yaml", cwd=stack).stdout
    assert up.startswith("started counter-a again from ") and "the other 2 servers of stack mini kept running" in up
    after = _servers(stack)
    assert (
        after["counter-b"]["pid"] == servers["counter-b"]["pid"]
        and after["counter-a"]["pid"] != servers["counter-a"]["pid"]
    )
    with httpx.Client(base_url=after["counter-b"]["url"], cookies=cookies) as http:  # its live session is still there
        assert http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1"}).json() == {"output": 42}
    status = gymckpt("status", cwd=stack)
    assert max(len(line) for line in status.stdout.splitlines()) <= WIDTH
    assert "checkpoint ck-after: COMPLETED" in gymckpt("checkpoint", "--id", "ck-after", "--quiet", cwd=stack).stdout

    again = gymckpt("up", "stack.yaml", cwd=stack, check=False)
    assert again.returncode == 1 and "already running" in again.stderr and "`gymckpt restart NAME`" in again.stderr
    restarted = gymckpt("restart", "counter-b", cwd=stack).stdout
    assert restarted.startswith("restarted counter-b (pid ")
    assert _servers(stack)["counter-b"]["pid"] != servers["counter-b"]["pid"]
    unknown = gymckpt("restart", "nope", cwd=stack, check=False)
    assert unknown.returncode == 1 and unknown.stderr.startswith("gymckpt restart: no server 'nope' in stack mini")
