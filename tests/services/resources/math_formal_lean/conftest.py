"""The Lean sandbox stand-in as a real uvicorn process on 127.0.0.1 (``gymckpt serve lean_sandbox_standin``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gym_services.stack.launcher import listen

REPO = Path(__file__).resolve().parents[4]


@dataclass
class StandinProcess:
    host: str
    port: int
    process: subprocess.Popen


def _start(log_path: Path) -> StandinProcess | None:
    sock = listen("lean_sandbox_standin")  # bound here and handed down: no other process can take the port
    port = sock.getsockname()[1]
    try:
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gym_services.cli",
                    "serve",
                    "lean_sandbox_standin",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--fd",
                    str(sock.fileno()),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(sock.fileno(),),
            )
    finally:
        sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return None  # exited at start: try again
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return StandinProcess("127.0.0.1", port, process)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the sandbox stand-in did not become healthy; see {log_path}")


@pytest.fixture(scope="module")
def standin_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    log_path = tmp_path_factory.mktemp("standin") / "standin.log"
    for _ in range(3):
        started = _start(log_path)
        if started is not None:
            break
    else:
        raise RuntimeError(f"the sandbox stand-in exited at start; see {log_path}")
    try:
        yield started
    finally:
        started.process.terminate()
        try:
            started.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            started.process.kill()
            started.process.wait(timeout=10)
