"""The proof agent stack as real uvicorn processes: checkpoint, SIGKILL everything, restore, continue.

Every server is started with ``gymckpt serve``'s entry point (only the Lean sandbox is the
stand-in); the coordinator drives their control routes over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.services.agents.real import proof_stack
from tests.services.agents.stack import uninterrupted
from tests.services.models.procs import ServerProcess, running, start_server
from tests.support.asgi import TOKEN, base_config

from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.models.inference_worker.policies.base import load_tasks
from gym_services.stack.launcher import listen

pytestmark = pytest.mark.e2e
ROW = load_tasks("math_formal_lean")[1]
ROLLOUT = "lean-1-0"


def start_sandbox(workdir: Path, ready_timeout_s: float = 30.0) -> ServerProcess:
    """The stand-in is not a Gym server (no /health/live): start it with gymckpt serve, probe /health."""
    workdir.mkdir(parents=True, exist_ok=True)
    sock = listen("lean_sandbox_standin")  # bound here and handed down: no other process can take the port
    port = sock.getsockname()[1]
    log_path = workdir / f"sandbox-{port}.log"
    try:
        with log_path.open("wb") as log:
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
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                pass_fds=(sock.fileno(),),
            )
    finally:
        sock.close()
    proc = ServerProcess("lean_sandbox_standin", f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{proc.url}/health", timeout=1).status_code == 200:
                return proc
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"the Lean sandbox stand-in did not start:\n{proc.log()}")


def start_stack(worker_url: str, workdir: Path) -> dict[str, ServerProcess]:
    procs: dict[str, ServerProcess] = {}
    try:
        procs["sandbox"] = start_sandbox(workdir)
        port = int(procs["sandbox"].url.rsplit(":", 1)[1])
        procs["lean"] = start_server(
            "math_formal_lean", base_config("math_formal_lean", sandbox_host="127.0.0.1", sandbox_port=port), workdir
        )
        procs["model"] = start_server(
            "policy_model", base_config("policy_model", upstream={"base_url": f"{worker_url}/v1"}), workdir
        )
        agent = base_config(
            "proof_refinement_agent",
            model_url=procs["model"].url,
            model="lean-refine",
            resources_url=procs["lean"].url,
            max_correction_turns=2,
        )
        procs["agent"] = start_server("proof_refinement_agent", agent, workdir)
        return procs
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise


def refs(procs: dict[str, ServerProcess]) -> list[ParticipantRef]:
    roles = {
        "model": ("policy_model", "model"),
        "agent": ("proof_refinement_agent", "agent"),
        "lean": ("math_formal_lean", "resources"),
    }
    return [ParticipantRef(pid, role, procs[key].url) for key, (pid, role) in roles.items()]


@pytest.fixture(scope="module")
def slow_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Slow enough that the correction generation (63 tokens) streams for about four seconds: the checkpoint must
    land inside it, also on a loaded machine (at 30 tokens/s it sometimes ended first under load)."""
    config = {"tokens_per_second": 15, "time_to_first_token_s": 0.05}
    with running("inference_worker", config, tmp_path_factory.mktemp("slow-worker")) as proc:
        yield proc


async def test_checkpoint_kill_restore_continue(slow_worker, tmp_path) -> None:
    worker = slow_worker
    expected, _ = await uninterrupted(proof_stack(worker.url), ROW, ROLLOUT)
    location = f"file://{tmp_path / 'store'}"
    body = {**ROW, "_ng_rollout_id": ROLLOUT, "_ng_attempt_index": 0}
    first = start_stack(worker.url, tmp_path / "first")
    try:
        async with httpx.AsyncClient(timeout=60) as http, ControlClient(TOKEN) as control:
            coordinator = Coordinator(refs(first), control)
            run = asyncio.create_task(http.post(f"{first['agent'].url}/run", json=body))
            verified = False
            for _ in range(
                2000
            ):  # until turn 0 is verified and the model has received a few of the correction's tokens
                verified = (
                    verified or "gym_lean_verifications_total{" in (await http.get(f"{first['lean'].url}/metrics")).text
                )
                live = (await control.status(refs(first)[0])).live
                if verified and live["generations"] > 0 and live["tokens_in_flight"] >= 3:
                    break  # a cut keeps exactly what was streamed: the checkpoint must land inside this generation
                await asyncio.sleep(0.005)
            else:
                raise AssertionError("the correction generation never started")
            result = await coordinator.checkpoint("ck-proc", location, prepare_timeout_s=10)
            assert result.status == "completed", result.error
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
    finally:
        for proc in first.values():
            proc.kill()  # a crash: no shutdown hooks

    second = start_stack(worker.url, tmp_path / "second")
    try:
        async with httpx.AsyncClient(timeout=60) as http, ControlClient(TOKEN) as control:
            coordinator = Coordinator(refs(second), control)
            restored = await coordinator.restore("ck-proc", location)
            assert restored.status == "completed", restored.error
            assert restored.episodes[ROLLOUT] == 1
            reply = await http.post(f"{second['agent'].url}/run", json={**body, "_ng_attempt_index": 1})
            assert reply.status_code == 200, reply.text
            assert reply.json() == expected
            late = await http.post(f"{second['agent'].url}/run", json=body)
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
            model_live = (await control.status(refs(second)[0])).live
            assert model_live["tokens_reused"] > 0  # the cut correction continued from its prefix
            metrics = (await http.get(f"{second['agent'].url}/metrics")).text
            assert 'gym_agent_runs_total{start="continued"} 1.0' in metrics
            assert 'gym_agent_steps_total{kind="replay",step="seed"}' not in metrics  # never re-seeded
            lean = (await http.get(f"{second['lean'].url}/metrics")).text
            assert 'gym_lean_verifications_total{proof_status="completed"} 1.0' in lean
            assert "has_sorry" not in lean  # turn 0 was verified before the crash, never again
    finally:
        for proc in second.values():
            proc.stop()
