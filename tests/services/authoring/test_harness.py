"""The authoring harness catches what it promises to catch: a server that loses its sessions at a restore, and one
that declares stateless while it holds sessions; and it passes a server that keeps the contract."""

from __future__ import annotations

import os
import textwrap

import pytest

from gym_services.authoring.episodes import Episodes
from gym_services.authoring.harness import check_server, new_secrets
from gym_services.authoring.processes import Launch, ServerFailed

pytestmark = pytest.mark.e2e

EPISODES = Episodes.model_validate(
    {
        "ignore_fields": ["session_id"],
        "episodes": [
            [
                {"path": "/seed_session", "json": {"start": 1}},
                {"path": "/increment", "json": {"by": 2}},
                {"path": "/increment", "json": {"by": 3}},
                {"path": "/verify", "json": {"target": 6}},
            ],
            [
                {"path": "/seed_session", "json": {"start": 10}},
                {"path": "/increment", "json": {"by": -2}},
                {"path": "/increment", "json": {"by": 1}},
                {"path": "/verify", "json": {"target": 9}},
            ],
        ],
    }
)

#: counters that break the contract, each its own server module (served by import path)
BROKEN = '''
from gym_services.control.protocol import VerifyMode
from gym_services.resources.common import ExportedParticipant, StatelessParticipant
from gym_services.resources.counter.app import Config, CounterSessions, _app


class Forgetful(CounterSessions):
    """Saves every session, brings none back."""

    def stage_session_states(self, states):
        return {}


def forgetful(config: Config):
    store = Forgetful()
    return _app(config, store, ExportedParticipant(store, verify=VerifyMode.WAIT))


def stateless(config: Config):
    store = CounterSessions()
    return _app(config, store, StatelessParticipant(store, verify=VerifyMode.WAIT))
'''


def launch(tmp_path, server: str) -> Launch:
    token, secret = new_secrets()
    (tmp_path / "broken_counters.py").write_text(textwrap.dedent(BROKEN))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return Launch(server, {}, tmp_path / "work", "counter", token, secret, env=env)


async def test_a_server_that_keeps_the_contract_passes(tmp_path) -> None:
    report = await check_server(launch(tmp_path, "counter"), EPISODES, rounds=2, seed=3)
    assert report.ok, report.text()
    assert report.mode == "exported" and report.rewards == [1.0, 1.0]
    rounds = [c.name for c in report.checks if c.name.startswith("round")]
    assert len(rounds) == 2 and len(set(rounds)) == 2  # two checkpoints, at different calls


async def test_a_server_that_loses_its_sessions_at_a_restore_fails(tmp_path) -> None:
    report = await check_server(launch(tmp_path, "broken_counters:forgetful"), EPISODES, rounds=1, seed=3)
    assert not report.ok
    (round_check,) = [c for c in report.checks if c.name.startswith("round")]
    assert not round_check.ok and "differ from the uninterrupted run" in round_check.detail


async def test_a_stateless_declaration_on_a_server_that_holds_sessions_fails(tmp_path) -> None:
    report = await check_server(launch(tmp_path, "broken_counters:stateless"), EPISODES, rounds=1, seed=3)
    assert report.mode == "stateless" and not report.ok
    declared = [c for c in report.checks if c.name == "declared mode"]
    assert declared and not declared[0].ok and "held 2 live sessions" in declared[0].detail, report.text()


async def test_a_server_without_control_routes_is_not_a_participant(tmp_path) -> None:
    """A server whose app has no control plane (checkpointing turned off: what a server not adapted looks like)."""
    token, secret = new_secrets()
    plain = Launch("counter", {"checkpoint": {"enabled": False}}, tmp_path, "counter", token, secret)
    with pytest.raises(ServerFailed, match="not a checkpoint participant"):
        await check_server(plain, EPISODES, rounds=1)
