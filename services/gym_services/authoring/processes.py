"""The server under check as a real process: ``gymckpt serve`` on a socket bound here, stopped with SIGKILL.

Every process is started in its own session (``start_new_session``) and killed as a process group, so a server
that starts children of its own leaves none behind; :meth:`ServerProcess.kill` waits until it is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gym_services.base.logs import get_logger
from gym_services.control.protocol import CONTROL_PREFIX

log = get_logger("check")


class ServerFailed(RuntimeError):
    """The server under check exited or never became ready; the message holds its log's tail."""


@dataclass
class Launch:
    """How to start the server under check: what ``gymckpt serve`` is given, and where its files go."""

    server: str
    config: dict[str, Any]
    workdir: Path
    participant_id: str
    control_token: str
    session_secret: str
    python: str = field(default_factory=lambda: sys.executable)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0


class ServerProcess:
    """One process of the server under check, on 127.0.0.1 at a port bound before it starts."""

    def __init__(self, launch: Launch, label: str) -> None:
        self.launch = launch
        self.label = label
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        launch.workdir.mkdir(parents=True, exist_ok=True)
        config_path = launch.workdir / f"{label}.yaml"
        config = {**launch.config, "host": "127.0.0.1", "port": self.port}
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = launch.workdir / f"{label}.log"
        env = {
            **os.environ,
            **launch.env,
            "GYMCKPT_CONTROL_TOKEN": launch.control_token,
            "GYMCKPT_SESSION_SECRET": launch.session_secret,
            "GYMCKPT_PARTICIPANT_ID": launch.participant_id,
            "PYTHONUNBUFFERED": "1",
        }
        command = [launch.python, "-m", "gym_services.cli", "serve", launch.server]
        command += ["--config", str(config_path), "--fd", str(sock.fileno())]
        try:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    command,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    pass_fds=(sock.fileno(),),
                )
        finally:
            sock.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.launch.ready_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise ServerFailed(
                        f"{self.launch.server} exited with {self.proc.returncode} while starting; log:\n{self.tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    ready = client.get(f"{self.url}/health/ready").status_code
                    control = client.get(f"{self.url}{CONTROL_PREFIX}/status").status_code
                    if control == 404 and ready in (200, 404):
                        self.kill()
                        raise ServerFailed(
                            f"{self.launch.server} serves, but has no control routes ({CONTROL_PREFIX}/status is "
                            "404): it is not a checkpoint participant (docs/authoring.md says how to make it one)"
                        )
                    if ready == 200:
                        return
                time.sleep(0.05)
        self.kill()
        raise ServerFailed(
            f"{self.launch.server} was not ready after {self.launch.ready_timeout_s:.0f}s; log:\n{self.tail()}"
        )

    def kill(self) -> None:
        """SIGKILL the process group and reap it (a crash, not a shutdown)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def started(launch: Launch, label: str) -> Iterator[ServerProcess]:
    """A ready :class:`ServerProcess`, killed when the block ends (also on error)."""
    process = ServerProcess(launch, label)
    try:
        process.wait_ready()
        yield process
    finally:
        process.kill()
