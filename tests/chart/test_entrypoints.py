"""The commands the chart names exist, and a rendered server command starts a server (the image: test_image.py)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.ports import free_port

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    assert found, f"{name} is not installed in {BIN}"
    return found


def known_servers() -> set[str]:
    """What `gymckpt serve` runs: the server registry, nothing else."""
    from gym_services.server.registry import SERVERS

    return set(SERVERS)


def test_rendered_commands_name_real_entrypoints(render: Any) -> None:
    docs = render()
    commands = [
        container["command"]
        for doc in docs
        if doc["kind"] in ("StatefulSet", "Deployment")
        for container in doc["spec"]["template"]["spec"]["containers"]
    ]
    servers = [cmd for cmd in commands if cmd[:2] == ["gymckpt", "serve"]]
    assert len(servers) == 5  # four servers and the rollout collection server
    for cmd in servers:
        assert cmd[2] in known_servers()
    (operator,) = [cmd for cmd in commands if cmd[0] == "gym-operator"]
    assert operator[1] == "--namespace" and "--liveness" in operator
    (forwarder,) = [cmd for cmd in commands if cmd[:2] == ["gymckpt", "forward"]]
    (_weed,) = [cmd for cmd in commands if cmd == ["weed"]]
    tool("gymckpt"), tool("gym-operator"), tool("weed")
    for cmd in (servers[0], forwarder):  # each parses as its program's command line
        done = subprocess.run([tool(cmd[0]), cmd[1], "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    done = subprocess.run([tool("gym-operator"), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--liveness" in done.stdout, done.stderr


def test_entrypoint_commands_answer_help() -> None:
    for command in (
        [tool("gymckpt"), "--help"],
        [tool("gymckpt"), "serve", "--help"],
        [tool("gym-operator"), "--help"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_operator_module_is_importable() -> None:
    handlers = importlib.import_module("gym_operator.handlers")
    assert callable(handlers.checkpoint_daemon)


def test_a_rendered_server_command_starts_the_server(render: Any, tmp_path: Path) -> None:
    """Run the container command of a rendered server (the counter) with its rendered config and env."""
    assert "counter" in known_servers()
    port, control_port = free_port(), free_port()
    docs = render(
        {
            "servers": [
                {"name": "counter", "server": "counter", "role": "resources", "port": port, "controlPort": control_port}
            ],
            "rollouts": {"enabled": False},
            "controlToken": {"value": "c" * 32},
            "sessionSecret": {"value": "s" * 32},
        }
    )
    config = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config)
    container = next(d for d in docs if d["kind"] == "StatefulSet" and "counter" in d["metadata"]["name"])["spec"][
        "template"
    ]["spec"]["containers"][0]
    command = [
        str(tmp_path / "config.yaml") if arg == "/etc/gymckpt/config.yaml" else arg for arg in container["command"]
    ]
    command[command.index("--host") + 1] = "127.0.0.1"  # tests bind loopback only
    env = {
        **os.environ,
        "GYMCKPT_CONTROL_TOKEN": "c" * 32,
        "GYMCKPT_SESSION_SECRET": "s" * 32,
        "GYMCKPT_PARTICIPANT_ID": "demo-gym-checkpoint-counter-0",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("the server did not become ready")
        status = httpx.get(
            f"http://127.0.0.1:{control_port}/ng-control/v1/checkpoint/status",
            headers={"Authorization": f"Bearer {'c' * 32}"},
            timeout=2,
        )
        assert status.status_code == 200, status.text
        assert "demo-gym-checkpoint-counter-0" in json.dumps(status.json())
        # the control routes answer on the control port only (the one the pod annotation names)
        assert httpx.get(f"http://127.0.0.1:{port}/ng-control/v1/checkpoint/status", timeout=2).status_code == 404
        pod = next(d for d in docs if d["kind"] == "StatefulSet" and "counter" in d["metadata"]["name"])["spec"][
            "template"
        ]["metadata"]
        assert pod["annotations"]["gym-checkpoint.dev/control-port"] == str(control_port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_default_values_give_every_server_a_config_it_accepts(render: Any, tmp_path: Path) -> None:
    """Each rendered ConfigMap, with the env the StatefulSet sets, builds that server's app."""
    from gym_services.server.serve import build_app

    docs = render({})
    configs = {
        d["metadata"]["name"]: d["data"]["config.yaml"]
        for d in docs
        if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]  # (not the CRDs hook's)
    }
    sets = [
        d
        for d in docs
        if d["kind"] == "StatefulSet"
        and "gymckpt"
        in " ".join(
            d["spec"]["template"]["spec"]["containers"][0].get("command", [])
            + d["spec"]["template"]["spec"]["containers"][0].get("args", [])
        )
    ]
    assert len(sets) >= 4
    env = {"GYMCKPT_CONTROL_TOKEN": "token", "GYMCKPT_SESSION_SECRET": "a-session-secret-of-some-length"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for stateful in sets:
            container = stateful["spec"]["template"]["spec"]["containers"][0]
            argv = container.get("command", []) + container.get("args", [])
            server = argv[argv.index("serve") + 1]
            volume = next(v for v in stateful["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
            path = tmp_path / f"{stateful['metadata']['name']}.yaml"
            path.write_text(configs[volume["configMap"]["name"]])
            app, config = build_app(server, path)
            assert app is not None and config.name in stateful["metadata"]["name"]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
