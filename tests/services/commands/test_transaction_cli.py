"""`gymckpt checkpoint` and `restore` as a new user meets them: Ctrl-C ends with one line and the command that
repeats the transaction, a storage location that cannot work is refused before anything is paused, --json is
JSON alone, and --version and a second `down` say something sensible."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from tests.services.commands.cli_support import gymckpt

from gym_services.stack.launcher import RunningServer, StackState


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("txn")
    (folder / "stack.yaml").write_text(
        "name: mini\nservers:\n  counter-a: {server: counter}\n  counter-b: {server: counter}\n"
    )
    gymckpt("up", "stack.yaml", cwd=folder)
    yield folder
    gymckpt("down", "--kill", cwd=folder, check=False)


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("file:///proc/gymckpt-x", "cannot create the storage folder /proc/gymckpt-x: No such file or directory; "),
        ("/plain/path", "unsupported storage location '/plain/path': use s3://bucket/prefix or file:///path"),
    ],
)
def test_a_storage_location_that_cannot_work_is_refused_first(stack, storage, message) -> None:
    proc = gymckpt("checkpoint", "--id", "nowhere", "--storage", storage, cwd=stack, check=False)
    assert proc.returncode == 1 and proc.stdout == ""  # no header line: nothing was started
    assert proc.stderr.startswith(f"gymckpt checkpoint: {message}") and len(proc.stderr.splitlines()) == 1


def test_checkpoint_json_quiet_is_json_alone(stack) -> None:
    out = gymckpt("checkpoint", "--id", "ck-json", "--json", "--quiet", cwd=stack).stdout
    assert json.loads(out)["checkpoint_id"] == "ck-json"
    loud = gymckpt("checkpoint", "--id", "ck-json-2", "--json", cwd=stack)
    assert json.loads(loud.stdout)["checkpoint_id"] == "ck-json-2"
    assert "checkpoint ck-json-2 of 2 participants" in loud.stderr  # what it did goes to stderr


class HoldingProxy:
    """An HTTP proxy on 127.0.0.1 in front of one server that forwards everything but the first ``holds`` POSTs
    (the coordinator's first control calls after discovery), which it holds unanswered until released and then
    drops: a participant that does not answer. ``held`` is set when the first arrives; ``paths`` lists the held
    ones' paths."""

    def __init__(self, target: str, holds: int = 1) -> None:
        self.target, self.held, self.release = target, threading.Event(), threading.Event()
        self.holds, self.paths, self.lock = holds, [], threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with proxy.lock:
                    hold = self.command == "POST" and len(proxy.paths) < proxy.holds
                    if hold:
                        proxy.paths.append(self.path)
                if hold:
                    proxy.held.set()
                    proxy.release.wait(120)
                    self.close_connection = True  # never forwarded: counter-b never saw this call
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(
                    self.command, proxy.target + self.path, content=body, headers=headers, timeout=30
                )
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(key, value)
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.mark.skipif(os.name != "posix", reason="SIGINT is how Ctrl-C reaches a process")
def test_ctrl_c_during_a_checkpoint_aborts_it_and_names_the_command_to_repeat_it(stack) -> None:
    """counter-b does not answer its prepare (a proxy holds it); Ctrl-C then ends the checkpoint as failed: the
    participants are aborted and resume, one line says so and how to take a new one, which completes."""
    state_file = stack / ".gymckpt/stack/stack.json"
    original = state_file.read_text()
    state = json.loads(original)
    b = next(s for s in state["servers"] if s["name"] == "counter-b")
    proxy = HoldingProxy(b["url"])
    b["url"] = proxy.url
    state_file.write_text(json.dumps(state))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_services.cli", "checkpoint", "--id", "ck-int", "--transaction-id", "tx-int"],
        cwd=stack,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GYMCKPT_STATE_DIR": str(stack / ".gymckpt/stack")},
    )
    try:
        assert proxy.held.wait(60), "the coordinator never called counter-b"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        proxy.close()
        state_file.write_text(original)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "checkpoint ck-int: FAILED" in out
    assert err.splitlines()[-1] == (
        "gymckpt checkpoint: interrupted; the checkpoint failed and the participants "
        "resumed where they were; `gymckpt checkpoint` takes a new one"
    )
    status = json.loads(gymckpt("status", "--json", cwd=stack).stdout)
    assert all(s["checkpoint_id"] is None and s["admission_open"] for s in status.values()), status
    again = gymckpt("checkpoint", "--id", "ck-int-2", "--quiet", cwd=stack)
    assert "checkpoint ck-int-2: COMPLETED" in again.stdout


def _held_in_front_of_counter_b(stack: Path, holds: int = 1) -> tuple[HoldingProxy, str]:
    """counter-b's URL in the stack state replaced by a :class:`HoldingProxy`'s; the original state to put back."""
    state_file = stack / ".gymckpt/stack/stack.json"
    original = state_file.read_text()
    state = json.loads(original)
    b = next(s for s in state["servers"] if s["name"] == "counter-b")
    proxy = HoldingProxy(b["url"], holds)
    b["url"] = proxy.url
    state_file.write_text(json.dumps(state))
    return proxy, original


def _interruptible(stack: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gym_services.cli", *args],
        cwd=stack,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GYMCKPT_STATE_DIR": str(stack / ".gymckpt/stack")},
        # as in a terminal: a suite started in the background by a non-interactive shell (CI) inherits SIGINT
        # ignored, and Python then never turns Ctrl-C into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait(what: str, predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _every_participant_open(stack: Path) -> None:
    """Every participant open again (one whose abort was cut short by the second Ctrl-C: once its lease ends)."""

    def status() -> dict:
        return json.loads(gymckpt("status", "--json", cwd=stack).stdout)

    _wait(
        "every participant open",
        lambda: all(s["checkpoint_id"] is None and s["admission_open"] for s in status().values()),
    )


@pytest.mark.skipif(os.name != "posix", reason="SIGINT is how Ctrl-C reaches a process")
def test_a_second_ctrl_c_during_the_abort_stops_waiting_in_one_line_and_the_same_checkpoint_completes(stack) -> None:
    """counter-b answers neither its prepare nor the abort the first Ctrl-C sends: a second Ctrl-C stops waiting,
    ends with one line (no traceback) naming the command that repeats the transaction, and that command
    completes the same checkpoint."""
    proxy, original = _held_in_front_of_counter_b(stack, holds=2)
    again = "gymckpt checkpoint --id ck-int2 --transaction-id tx-int2"
    proc = _interruptible(stack, "checkpoint", "--id", "ck-int2", "--transaction-id", "tx-int2")
    try:
        assert proxy.held.wait(60), "the coordinator never called counter-b"
        proc.send_signal(signal.SIGINT)
        _wait("the abort to reach counter-b", lambda: len(proxy.paths) == 2 or proc.poll() is not None)
        assert proc.poll() is None and proxy.paths[1].endswith("/abort"), proxy.paths
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proxy.close()
        (stack / ".gymckpt/stack/stack.json").write_text(original)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Unclosed" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("gymckpt checkpoint: Ctrl-C: ending the checkpoint as failed"), err
    assert lines[1:] == [
        "gymckpt checkpoint: stopped waiting for the abort; each participant not aborted yet resumes on its own "
        f"when its lease ends (--lease 30s; `gymckpt status` shows them); `{again}` repeats the same checkpoint"
    ], err
    assert "COMPLETED" not in out and "FAILED" not in out  # no summary: the transaction did not end
    _every_participant_open(stack)  # counter-a was aborted, counter-b never saw the checkpoint
    repeated = gymckpt(*again.split()[1:], "--quiet", cwd=stack)
    assert "checkpoint ck-int2: COMPLETED" in repeated.stdout


@pytest.mark.skipif(os.name != "posix", reason="SIGINT is how Ctrl-C reaches a process")
def test_ctrl_c_during_a_restore_undoes_it_everywhere_and_it_can_run_again(stack) -> None:
    """counter-b does not answer its restore; Ctrl-C aborts at once (not after the restore call's timeout): the
    restore is undone on counter-a, one line says so and how to run it again, which completes."""
    gymckpt("checkpoint", "--id", "ck-restore", "--quiet", cwd=stack)
    proxy, original = _held_in_front_of_counter_b(stack)
    proc = _interruptible(stack, "restore", "ck-restore")
    try:
        assert proxy.held.wait(60), "the coordinator never called counter-b"
        assert proxy.paths[0].endswith("/restore"), proxy.paths
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # the held call would hold it for 120 s
    finally:
        proxy.close()
        (stack / ".gymckpt/stack/stack.json").write_text(original)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "restore ck-restore: FAILED" in out
    assert err.splitlines()[-1] == (
        "gymckpt restore: interrupted; the restore failed and the participants resumed where they were; "
        "`gymckpt restore ck-restore` restores it again"
    )
    _every_participant_open(stack)
    assert "restore ck-restore: COMPLETED" in gymckpt("restore", "ck-restore", "--quiet", cwd=stack).stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads which libraries a process has loaded")
def test_ctrl_c_while_gymckpt_starts_is_one_line(tmp_path) -> None:
    """Ctrl-C while the command still imports its modules (seconds on a loaded machine): one line, exit 130."""
    proc = _interruptible(tmp_path, "status")
    try:
        # pydantic's compiled core is loaded early among the commands' imports: the Ctrl-C lands while starting
        _wait("the imports under way", lambda: proc.poll() is not None or "pydantic_core" in _maps(proc.pid))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if proc.returncode == 130:  # else it had ended already: its own error, no stack here
        assert err.strip().splitlines() == ["gymckpt: interrupted while starting; nothing was done"] or (
            err.strip().splitlines() == ["gymckpt status: interrupted"]
        ), err
    else:
        assert proc.returncode == 1 and len(err.splitlines()) == 1, (proc.returncode, err)


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_version_and_a_second_down(tmp_path) -> None:
    assert gymckpt("--version", cwd=tmp_path).stdout.startswith("gymckpt ")
    (tmp_path / "stack.yaml").write_text("name: one\nservers:\n  counter-a: {server: counter}\n")
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    try:
        stopped, final = gymckpt("down", cwd=tmp_path).stdout.splitlines()
        assert stopped == "stopped 1 server: counter-a"
        assert final.startswith("final checkpoint final-") and final.endswith("`gymckpt up` resumes from it")
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)
    again = gymckpt("down", cwd=tmp_path).stdout
    assert again == f"nothing to stop: no server of the stack in {tmp_path / '.gymckpt/stack'} was running\n"


def test_restore_says_which_server_configs_changed_since_the_checkpoint(tmp_path) -> None:
    """A restore into a stack whose server config changed (a changed agent setting can change rewards) goes on,
    with a warning naming the server, the key and both values; ports and URLs, new on every `up`, are no change."""

    def write(backoff: float) -> None:
        (tmp_path / "stack.yaml").write_text(
            "name: cfg\nservers:\n  counter-a: {server: counter}\n  collection: {server: collection, config: "
            f"{{agents: {{a: '{{url:counter-a}}'}}, unavailable_backoff_max_s: {backoff}, job_dirs: ['.']}}}}\n"
        )

    write(0.5)
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    try:
        gymckpt("checkpoint", "--id", "k1", "--quiet", cwd=tmp_path)
        gymckpt("down", "--kill", cwd=tmp_path)
        gymckpt("up", "stack.yaml", cwd=tmp_path)  # new ports: not a change
        same = gymckpt("restore", "k1", "--quiet", cwd=tmp_path)
        assert "restore k1: COMPLETED" in same.stdout and "warning" not in same.stderr, same.stderr
        gymckpt("down", "--kill", cwd=tmp_path)
        write(0.7)
        gymckpt("up", "stack.yaml", cwd=tmp_path)
        changed = gymckpt("restore", "k1", "--quiet", cwd=tmp_path)
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)
    assert "restore k1: COMPLETED" in changed.stdout
    assert changed.stderr == (
        "gymckpt restore: warning: server configs changed since k1 was taken: collection "
        "(unavailable_backoff_max_s: 0.5 -> 0.7); its episodes continue under the new configs\n"
    )


def test_another_servers_port_is_no_config_change(tmp_path) -> None:
    """`{port:lean-sandbox}` resolves to a new port on every `up`: not a change a restore warns about (the demo stack's
    math-formal-lean said "sandbox_port: 45479 -> 38847" after `down --kill` and `up`); a changed setting still is."""
    from gym_services.commands.stack.configs import config_changes, server_configs

    def state(sandbox: int, lean: int, max_steps: int) -> StackState:
        (tmp_path / "configs").mkdir(exist_ok=True)
        (tmp_path / "configs" / "lean.yaml").write_text(
            f"name: lean\nport: {lean}\nsandbox_host: 127.0.0.1\nsandbox_port: {sandbox}\nmax_steps: {max_steps}\n"
        )
        servers = [
            RunningServer(name=n, server=n, url=f"http://127.0.0.1:{p}", port=p, pid=1, participant=n == "lean", log="")
            for n, p in (("sandbox", sandbox), ("lean", lean))
        ]
        return StackState(name="s", state_dir=str(tmp_path), storage="file:///x", servers=servers)

    (tmp_path / "checkpoint-configs").mkdir()
    (tmp_path / "checkpoint-configs" / "k.json").write_text(json.dumps(server_configs(state(45479, 40001, 3))))
    assert config_changes(state(38847, 40002, 3), "k") == []
    assert config_changes(state(38848, 40003, 4), "k") == ["lean (max_steps: 3 -> 4)"]


def test_restore_into_a_stack_without_one_of_the_checkpoints_servers_names_it(tmp_path) -> None:
    (tmp_path / "stack.yaml").write_text(
        "name: two\nservers:\n  counter-a: {server: counter}\n  counter-b: {server: counter}\n"
    )
    gymckpt("up", "stack.yaml", cwd=tmp_path)
    try:
        gymckpt("checkpoint", "--id", "k2", "--quiet", cwd=tmp_path)
        gymckpt("down", "--kill", cwd=tmp_path)
        (tmp_path / "stack.yaml").write_text("name: two\nservers:\n  counter-a: {server: counter}\n")
        gymckpt("up", "stack.yaml", cwd=tmp_path)
        refused = gymckpt("restore", "k2", cwd=tmp_path, check=False)
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        "gymckpt restore: checkpoint k2 holds the state of counter-b, which stack two has no server "
        "for; a restore needs every one: add them back to the stack YAML, then `gymckpt down` and "
        "`gymckpt up CONFIG`\n"
    )
