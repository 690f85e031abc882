"""One Gym server as a real ``gymckpt serve`` process on 127.0.0.1, for the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.support.ports import free_port

TOKEN = "bench-control-token"
SECRET = "bench-session-secret-0123456789"


def start_server(
    server: str, config: dict[str, Any], tmp: Path, timeout_s: float = 20.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``server`` with ``config`` on a free port; return once ``/health/ready`` answers 200."""
    port = free_port()
    path = tmp / f"{server}-{port}.yaml"
    path.write_text(yaml.safe_dump({"name": server, "port": port, "log_level": "warning", **config}))
    env = {**os.environ, "GYMCKPT_CONTROL_TOKEN": TOKEN, "GYMCKPT_SESSION_SECRET": SECRET}
    log = (tmp / f"{server}-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_services.cli", "serve", server, "--config", str(path)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{server} did not start; see {log.name}")


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as a crash would."""
    proc.kill()
    proc.wait(timeout=10)
