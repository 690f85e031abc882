"""The gymckpt command end to end on a small local stack (real processes), and --help everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

COMMANDS = [
    ["serve"], ["up"], ["down"], ["status"], ["collect"], ["checkpoint"], ["restore"],
    ["checkpoints"], ["checkpoints", "list"], ["checkpoints", "show"], ["demo"],
    ["cluster"], ["cluster", "checkpoint"], ["cluster", "restore"], ["forward"],
]


def gymckpt(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gym_services.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GYMCKPT_STATE_DIR": str(cwd / ".gymckpt/stack")})
    if check:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command, tmp_path) -> None:
    out = gymckpt(*command, "--help", cwd=tmp_path).stdout
    assert out.startswith("usage: gymckpt")


def test_up_checkpoint_kill_restore_with_the_cli(tmp_path) -> None:
    (tmp_path / "stack.yaml").write_text(
        "name: mini\nservers:\n  counter-a: {server: counter}\n  counter-b: {server: counter}\n"
    )
    up = gymckpt("up", "stack.yaml", cwd=tmp_path).stdout
    assert "stack mini is up (2 servers)" in up
    state = json.loads((tmp_path / ".gymckpt/stack/stack.json").read_text())
    url = state["servers"][0]["url"]
    try:
        with httpx.Client(base_url=url) as http:
            http.post("/seed_session", json={"start": 41}, headers={"x-ng-rollout-id": "r1"})
            cookies = dict(http.cookies)
        status = gymckpt("status", "--json", cwd=tmp_path).stdout
        assert json.loads(status)["counter-a"]["live"] == {"sessions": 1}
        out = gymckpt("checkpoint", "--id", "ck1", cwd=tmp_path).stdout
        assert "checkpoint ck1: COMPLETED" in out and "pause seen by rollouts" in out
        busy = gymckpt("up", "stack.yaml", cwd=tmp_path, check=False)
        assert busy.returncode == 1 and "already running" in busy.stderr
        assert "killed 2 servers" in gymckpt("down", "--kill", cwd=tmp_path).stdout
        gymckpt("up", "stack.yaml", cwd=tmp_path)
        restored = gymckpt("restore", "ck1", "--restore-id", "rs-cli", cwd=tmp_path).stdout
        assert "restore ck1: COMPLETED" in restored and "episodes continuing as a new attempt: 1" in restored
        assert "(restore id rs-cli)" in restored
        url = json.loads((tmp_path / ".gymckpt/stack/stack.json").read_text())["servers"][0]["url"]
        with httpx.Client(base_url=url, cookies=cookies) as http:
            again = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "1"})
            assert again.json() == {"output": 42}
        repeated = gymckpt("restore", "ck1", "--restore-id", "rs-cli", cwd=tmp_path).stdout  # idempotent, nothing twice
        assert "restore ck1: COMPLETED" in repeated and "episodes continuing as a new attempt: 1" in repeated
        with httpx.Client(base_url=url, cookies=cookies) as http:
            kept = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "1"})
            assert kept.json() == {"output": 43}  # the session was not installed a second time
        listed = gymckpt("checkpoints", "list", cwd=tmp_path).stdout
        assert "ck1  complete" in listed
        shown_text = gymckpt("checkpoints", "show", "ck1", cwd=tmp_path).stdout
        assert [line.split() for line in shown_text.splitlines() if "rs-cli" in line] == [["rs-cli", "resume", "coordinator"]]
        shown = json.loads(gymckpt("checkpoints", "show", "ck1", "--json", cwd=tmp_path).stdout)
        assert {p["participant_id"] for p in shown["participants"]} == {"counter-a", "counter-b"}
        missing = gymckpt("restore", "nope", cwd=tmp_path, check=False)
        assert missing.returncode == 1 and "no checkpoint nope at file://" in missing.stderr
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)


def test_reward_table_summarises_results_per_agent(tmp_path) -> None:
    from gym_services.commands.stack import reward_table

    path = tmp_path / "results.jsonl"
    rows = [
        {"agent": "a", "reward": 1.0}, {"agent": "a", "reward": 0.0},
        {"agent": "b", "reward": -1}, {"agent": "b", "reward": None, "error": "HTTP 502"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = reward_table(path).splitlines()
    assert lines[2].split() == ["a", "2", "0", "0.500", "0", "..", "1"]
    assert lines[3].split() == ["b", "2", "1", "-1.000", "-1", "..", "-1"]
