"""A terminated stack with an external participant (a server it did not start): the final checkpoint includes it, the
stack's own servers exit, and the external one is let go on serving instead of exiting when its lease runs out
(stack/supervisor.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gym_services.authoring.processes import Launch, started
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.stack.config import StackConfig
from gym_services.stack.history import read_history
from gym_services.stack.launcher import is_running, stack_secrets, start_stack, stop_stack
from gym_services.stack.supervision import start_supervisor, terminate_stack

pytestmark = pytest.mark.e2e


async def test_the_final_checkpoint_lets_an_external_participant_go_on(tmp_path) -> None:
    token = stack_secrets(tmp_path / "state")["control_token"]
    launch = Launch("counter", {"name": "counter"}, tmp_path / "outside", "elsewhere", token, "s" * 32)
    with started(launch, "elsewhere") as outside:
        config = StackConfig.model_validate(
            {
                "name": "mixed",
                "state_dir": "state",
                "checkpoint": {"termination_grace": "20s"},
                "servers": {"elsewhere": {"external": outside.url}, "counter-a": {"server": "counter"}},
            }
        )
        state = start_stack(config, tmp_path, supervise=True)
        try:
            await asyncio.to_thread(start_supervisor, Path(state.state_dir))
            stopped = await asyncio.to_thread(terminate_stack, Path(state.state_dir))
            assert stopped.termination is not None and stopped.termination.outcome == "published"
            assert not any(is_running(s) for s in state.servers)  # the stack's own server exited
            history = read_history(Path(state.state_dir))
            assert history is not None and history.termination is not None and history.termination.final is not None
            async with ControlClient(token) as client:
                status = await client.status(ParticipantRef("elsewhere", "resources", outside.url))
            assert status.phase == "open" and status.admission_open  # released, serving
            async with httpx.AsyncClient(base_url=outside.url) as http:
                assert (await http.get("/health/ready")).status_code == 200
        finally:
            await asyncio.to_thread(stop_stack, Path(state.state_dir), kill=True)
