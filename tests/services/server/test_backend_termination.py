"""A backend whose app has no control plane (the Lean sandbox stand-in, a plain Starlette app) terminates as any
backend with a grace does (``docs/protocol.md``, "Termination"): after SIGTERM it goes on answering, so a proof
verified just before the stack's final checkpoint is graded by the sandbox, not failed as unreachable; a later
SIGINT stops it. A real ``gymckpt serve`` process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gym_services.resources.math_formal_lean.sandbox_standin import VERIFIED_MARKER
from gym_services.stack.launcher import listen

REPO = Path(__file__).resolve().parents[3]
PROOF = f"theorem t : True := by\n  {VERIFIED_MARKER}\n  trivial\n"


@pytest.fixture
def standin(tmp_path):
    sock = listen("lean_sandbox_standin")  # bound here and handed down: no other process can take the port
    port = sock.getsockname()[1]
    command = [sys.executable, "-m", "gym_services.cli", "serve", "lean_sandbox_standin", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--fd", str(sock.fileno()), "--termination-grace", "30"]
    with (tmp_path / "standin.log").open("ab") as log:
        # started with SIGINT ignored, as a script's background job is (and as a pytest-xdist worker may leave it):
        # the server still stops at SIGINT, as interrupted
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(sock.fileno(),),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    sock.close()
    try:
        yield f"http://127.0.0.1:{port}", process, tmp_path / "standin.log"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _execute(client: httpx.Client, url: str) -> dict:
    response = client.post(f"{url}/execute", json={"generated_code": PROOF, "timeout": 5})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_backend_without_control_plane_serves_through_its_grace_and_stops_at_sigint(standin) -> None:
    url, process, log = standin
    with httpx.Client(timeout=5, trust_env=False) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the stand-in did not become healthy"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10  # the signal is taken at the server's next tick
        while "terminating" not in log.read_text():
            assert process.poll() is None, log.read_text()  # it did not exit at the signal
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # past a drain it would have begun at the signal
        assert process.poll() is None, log.read_text()
        assert _execute(client, url)["process_status"] == "completed"  # graded as ever, not refused
    os.killpg(process.pid, signal.SIGINT)  # the supervisor's stop once the final checkpoint is published
    assert process.wait(timeout=15) == 130, log.read_text()  # `gymckpt serve: interrupted`, as any server at SIGINT
    assert '"outcome": "stopped"' in log.read_text()
