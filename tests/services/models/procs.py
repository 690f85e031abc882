"""Gym servers as real uvicorn processes on 127.0.0.1, for the model tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from gym_services.stack.launcher import listen


@dataclass
class ServerProcess:
    name: str
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, like a crashed pod."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_server(
    server: str, config: dict, workdir: Path, ready_timeout_s: float = 30.0, port: int | None = None
) -> ServerProcess:
    """Start ``server`` with ``config`` (YAML) on ``port`` or a free one.

    The test binds the listening socket and hands it down (``gymckpt serve --fd``), as the stack launcher does:
    a port picked free and bound later by the server could meanwhile be taken by another process on the machine
    (another test run in parallel), which would then answer this server's readiness probe."""
    workdir.mkdir(parents=True, exist_ok=True)
    sock = listen(server, port or 0)
    port = sock.getsockname()[1]
    config_path = workdir / f"{server}-{port}.yaml"
    config_path.write_text(yaml.safe_dump({"name": server, **config}))
    log_path = workdir / f"{server}-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gym_services.cli",
                    "serve",
                    server,
                    "--config",
                    str(config_path),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--fd",
                    str(sock.fileno()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(sock.fileno(),),
            )
    finally:
        sock.close()
    proc = ServerProcess(server, f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{proc.url}/health/live", timeout=1).status_code == 200:
                return proc
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"{server} did not start:\n{proc.log()}")


@contextlib.contextmanager
def running(server: str, config: dict, workdir: Path) -> Iterator[ServerProcess]:
    proc = start_server(server, config, workdir)
    try:
        yield proc
    finally:
        proc.stop()
