"""`gymckpt serve --control-port`: the control routes on their own port (so a NetworkPolicy can fence them
off to the operator), the data routes on the main one; probes and metrics on both. A real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from tests.support.ports import free_port

TOKEN = "control-token-0123456789"
PREFIX = "/ng-control/v1/checkpoint"


@pytest.fixture
def counter():
    data, control = free_port(), free_port()
    env = {**os.environ, "GYMCKPT_CONTROL_TOKEN": TOKEN, "GYMCKPT_SESSION_SECRET": "s" * 32}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gym_services.cli",
            "serve",
            "counter",
            "--port",
            str(data),
            "--control-port",
            str(control),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the server exited"
            try:
                if httpx.get(f"http://127.0.0.1:{control}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("not ready")
        yield f"http://127.0.0.1:{data}", f"http://127.0.0.1:{control}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_control_and_data_routes_each_on_their_own_port(counter) -> None:
    data, control = counter
    auth = {"authorization": f"Bearer {TOKEN}"}
    status = httpx.get(f"{control}{PREFIX}/status", headers=auth)
    assert status.status_code == 200 and status.json()["phase"] == "fresh"
    wrong_port = httpx.get(f"{data}{PREFIX}/status", headers=auth)
    assert wrong_port.status_code == 404
    assert wrong_port.json()["error"] == {
        "code": "not_found",
        "message": f"control routes are served on port {control.rsplit(':', 1)[1]}",
    }
    assert httpx.post(f"{data}{PREFIX}/prepare", headers=auth, json={"checkpoint_id": "x"}).status_code == 404

    seeded = httpx.post(f"{data}/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "r1"})
    assert seeded.status_code == 200
    not_here = httpx.post(f"{control}/seed_session", json={"start": 1})
    assert not_here.status_code == 404 and "data routes are on port" in not_here.json()["error"]["message"]
    for url in (data, control):
        assert httpx.get(f"{url}/health/live").status_code == 200
        assert "gym_" in httpx.get(f"{url}/metrics").text
    # the control plane still needs its token on its own port
    assert httpx.get(f"{control}{PREFIX}/status").status_code == 401
    assert httpx.get(f"{control}{PREFIX}/status", headers=auth).json()["live"] == {"sessions": 1}
