"""The gymckpt command end to end on a small local stack (real processes), and --help everywhere."""

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

COMMANDS = [
    ["serve"],
    ["up"],
    ["down"],
    ["status"],
    ["collect"],
    ["checkpoint"],
    ["restore"],
    ["restart"],
    ["checkpoints"],
    ["checkpoints", "list"],
    ["checkpoints", "show"],
    ["checkpoints", "delete"],
    ["demo"],
    ["cluster"],
    ["cluster", "checkpoint"],
    ["cluster", "restore"],
    ["forward"],
]


def gymckpt(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GYMCKPT_STATE_DIR": str(cwd / ".gymckpt/stack")},
    )
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
        assert [line.split() for line in shown_text.splitlines() if "rs-cli" in line] == [
            ["rs-cli", "resume", "coordinator"]
        ]
        shown = json.loads(gymckpt("checkpoints", "show", "ck1", "--json", cwd=tmp_path).stdout)
        assert {p["participant_id"] for p in shown["participants"]} == {"counter-a", "counter-b"}
        missing = gymckpt("restore", "nope", cwd=tmp_path, check=False)
        assert missing.returncode == 1 and "no checkpoint nope at file://" in missing.stderr
        stored = sorted(p for p in (tmp_path / ".gymckpt/stack/checkpoints/ck1").rglob("*") if p.is_file())
        assert len(stored) >= 5  # manifest, two participant manifests and records, the restore decision
        deleted = gymckpt("checkpoints", "delete", "ck1", cwd=tmp_path).stdout
        assert deleted.startswith("deleted checkpoint ck1 at file://") and f": {len(stored)} objects" in deleted
        assert not [p for p in (tmp_path / ".gymckpt/stack/checkpoints/ck1").rglob("*") if p.is_file()]
        assert "(none)" in gymckpt("checkpoints", "list", cwd=tmp_path).stdout
        again = gymckpt("checkpoints", "delete", "ck1", cwd=tmp_path, check=False)
        assert again.returncode == 1 and "no checkpoint ck1 at file://" in again.stderr
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)


def test_a_checkpoint_id_taken_by_another_stack_is_refused(tmp_path) -> None:
    """`checkpoint --id ck1` where another stack's ck1 already is: exit 1, a clear message,
    nothing paused and nothing written; the same transaction repeated is answered from its manifest."""
    shared = tmp_path / "shared"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stack.yaml").write_text(
            f"name: {name}\nstorage: file://{shared}\nservers:\n  counter-a: {{server: counter}}\n"
        )
    try:
        gymckpt("up", "stack.yaml", cwd=tmp_path / "a")
        gymckpt("up", "stack.yaml", cwd=tmp_path / "b")
        first = gymckpt("checkpoint", "--id", "ck1", "--quiet", cwd=tmp_path / "a").stdout
        assert "checkpoint ck1: COMPLETED" in first
        transaction = first.split("(transaction ")[1].split(")")[0]
        manifest = (shared / "checkpoints/ck1/manifest.json").read_bytes()
        refused = gymckpt("checkpoint", "--id", "ck1", "--quiet", cwd=tmp_path / "b", check=False)
        assert refused.returncode == 1, refused.stdout
        assert "checkpoint ck1: FAILED" in refused.stdout
        assert f"error: checkpoint ck1 already exists at file://{shared} (published " in refused.stdout
        assert (
            f"by transaction {transaction}); nothing was paused or written: choose another checkpoint id"
            in refused.stdout
        )
        assert (shared / "checkpoints/ck1/manifest.json").read_bytes() == manifest
        status = json.loads(gymckpt("status", "--json", cwd=tmp_path / "b").stdout)["counter-a"]
        assert status["phase"] == "fresh" and status["admission_open"] and status["last_event"] is None
        repeated = gymckpt("checkpoint", "--id", "ck1", "--transaction-id", transaction, "--quiet", cwd=tmp_path / "a")
        assert "checkpoint ck1: COMPLETED" in repeated.stdout and "already published; nothing to do" in repeated.stdout
    finally:
        for name in ("a", "b"):
            if (tmp_path / name / ".gymckpt/stack/stack.json").exists():
                gymckpt("down", "--kill", cwd=tmp_path / name, check=False)


def test_reward_table_summarises_results_per_agent(tmp_path) -> None:
    from gym_services.commands.stack.job_files import reward_table

    path = tmp_path / "results.jsonl"
    rows = [
        {"agent": "a", "reward": 1.0},
        {"agent": "a", "reward": 0.0},
        {"agent": "b", "reward": -1},
        {"agent": "b", "reward": None, "error": "HTTP 502"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = reward_table(path).splitlines()
    assert lines[2].split() == ["a", "2", "0", "0.500", "0", "..", "1"]
    assert lines[3].split() == ["b", "2", "1", "-1.000", "-1", "..", "-1"]


def test_commands_on_a_stopped_stack_say_it_is_not_running(tmp_path) -> None:
    (tmp_path / "stack.yaml").write_text(
        "name: mini\nservers:\n  counter-a: {server: counter}\n"
        "  policy-model: {server: policy_model, config: {upstream: {base_url: 'http://127.0.0.1:9/v1'}}}\n"
        "  collection: {server: collection, config: {job_dirs: ['.']}}\n"
    )
    (tmp_path / "tasks.jsonl").write_text('{"x": 1}\n')
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    try:
        state = json.loads((tmp_path / ".gymckpt/stack/stack.json").read_text())
        model_pid = next(s["pid"] for s in state["servers"] if s["name"] == "policy-model")
        os.killpg(model_pid, signal.SIGKILL)  # one participant crashed
        _wait_gone(model_pid)
        shown = gymckpt("status", cwd=tmp_path, check=False)
        assert shown.returncode == 1 and shown.stderr.startswith("gymckpt status: not running: policy-model; ")
        status = shown.stdout
        assert [line.split()[:3] for line in status.splitlines() if "policy-model" in line] == [
            ["policy-model", "?", "not"]
        ]
        assert "not running" in status and "resources" in status  # counter-a still answers
        partial = gymckpt("checkpoint", cwd=tmp_path, check=False)
        assert partial.returncode == 1
        assert partial.stderr.startswith(
            "gymckpt checkpoint: not running: policy-model; a checkpoint or restore needs every"
        )
    finally:
        gymckpt("down", "--no-checkpoint", cwd=tmp_path)  # a participant is gone: no final checkpoint could be taken
    for command in (["collect", "tasks.jsonl"], ["status"], ["checkpoint"], ["restore", "ck1"]):
        done = gymckpt(*command, cwd=tmp_path, check=False)
        assert done.returncode == 1, command
        assert done.stderr == (
            f"gymckpt {command[0]}: the stack mini is not running (its 3 servers have stopped); "
            "start it with `gymckpt up CONFIG`\n"
        ), (command, done.stderr)


def test_output_into_a_closed_pipe_ends_quietly(tmp_path) -> None:
    """`gymckpt ... | head`: once the reader is gone, no BrokenPipeError traceback, the SIGPIPE status."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gym_services.cli", "checkpoints", "list", "--storage", f"file://{tmp_path}"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == ""


def test_collect_says_when_the_job_makes_no_progress(tmp_path) -> None:
    """The only agent is unreachable: the job cannot progress, and `collect` says so on stderr, with why."""
    (tmp_path / "stack.yaml").write_text(
        "name: stall\nservers:\n  collection: {server: collection, config: "
        "{agents: {ghost: 'http://127.0.0.1:9'}, unavailable_backoff_max_s: 0.5, job_dirs: ['.']}}\n"
    )
    (tmp_path / "tasks.jsonl").write_text('{"agent": "ghost", "responses_create_params": {"input": "hi"}}\n')
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    try:
        proc = gymckpt(
            "collect", "tasks.jsonl", "--stall-warning", "1", "--wait-timeout", "4", cwd=tmp_path, check=False
        )
    finally:
        gymckpt("down", cwd=tmp_path)
    assert proc.returncode == 1 and "did not complete within --wait-timeout 4s" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no episode has finished for" in line]
    assert 2 <= len(warnings) <= 4, proc.stderr  # once per --stall-warning interval, not on every poll
    assert "1 waiting to run again after an infrastructure failure" in warnings[0]
    assert "agent ghost unreachable: ConnectError" in warnings[0]


def _wait_gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_demo_progress_is_plain_lines_when_not_a_terminal() -> None:
    import io

    from gym_services.commands.progress import JobProgress

    stream = io.StringIO()  # not a terminal: no bar, no carriage returns
    progress = JobProgress(stream, interval_s=0.05)
    job = {"total": 4, "finished": 1, "live": 3, "errors": 0, "state": "running"}
    progress("collect", job)
    progress("collect", job)  # unchanged and too soon: nothing
    time.sleep(0.06)
    progress("collect", {**job, "retrying": 2, "last_failure": "0-0: agent a unreachable"})
    progress("collect", {**job, "finished": 4, "live": 0, "state": "completed"})
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "collect: 1/4 episodes finished, 3 live"
    assert lines[1].startswith("collect: 1/4 episodes finished, 3 live; nothing finished for ")
    assert lines[1].endswith(
        "2 waiting to run again after an infrastructure failure (latest: 0-0: agent a unreachable)"
    )
    assert lines[2] == "collect: 4/4 episodes finished, 0 live (completed)" and len(lines) == 3


def test_a_ctrl_c_caught_inside_evaluated_source_still_exits_130(tmp_path) -> None:
    """A Ctrl-C landing while a module builds code from text (dataclasses do, on import) is ours to report.

    CPython remembers it as unhandled and, under ``python -m``, would die by SIGINT (-2) on the way
    out although the command caught it and returned 130; the CLI clears that mark before it returns.
    """
    (tmp_path / "ctrl_c_probe.py").write_text(
        "import sys\n"
        "from gym_services import cli\n"
        "def interrupted_while_importing():\n"
        "    exec('raise KeyboardInterrupt', {})\n"
        "cli.build_parser = interrupted_while_importing\n"
        "sys.exit(cli.main(['status']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "ctrl_c_probe"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr.strip()) == (130, "gymckpt: interrupted while starting; nothing was done")
