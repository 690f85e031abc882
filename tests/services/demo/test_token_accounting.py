"""How the demo and the scale-out benchmark count generated tokens.

The demo counts, for any engine, what the policy models received (their status ``tokens_generated``), so
no worker's private stats are needed. The benchmark's worker failover counts built-in workers by their
token mirrors, and a killed one by what the policy models received from it: a sender cannot make "the
token's bytes reached the kernel" and "the token was counted" one step, so a killed worker's own count
can be one short per stream it was writing when the kill landed (a CI run under load once reported
"-1 tokens regenerated" from the mirror).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.scale_out import worker_tokens

from gym_services.demo.story import delivered_by, model_tokens
from gym_services.models.inference_worker.generation import TokenMirror, token_mirror_path
from gym_services.models.policy_model.fleet import Fleet
from gym_services.stack.launcher import RunningServer, StackState


def _worker(name: str, ordinal: int, port: int) -> RunningServer:
    return RunningServer(
        name=name,
        server="inference_worker",
        url=f"http://127.0.0.1:{port}",
        port=port,
        pid=1,
        participant=False,
        log="",
        group="inference-worker",
        ordinal=ordinal,
        replicas=2,
    )


def _live(received: dict[str, int]) -> dict:
    """A policy model's status ``live`` counts, built by a real fleet over both workers."""
    fleet = Fleet(["http://127.0.0.1:9100/v1", "http://127.0.0.1:9101/v1"])
    for url, tokens in received.items():
        stream = fleet.open(fleet.workers[url], 10)
        fleet.received(stream, tokens)
        fleet.close(stream)
    return fleet.counts()


def test_a_killed_worker_counts_what_the_policy_models_received_from_it(tmp_path: Path) -> None:
    state = StackState(
        name="demo",
        state_dir=str(tmp_path),
        storage="file:///x",
        servers=[_worker("inference-worker-0", 0, 9100), _worker("inference-worker-1", 1, 9101)],
    )
    mirrors = {w.name: TokenMirror(token_mirror_path(tmp_path, w.name)) for w in state.servers}
    mirrors["inference-worker-0"].write(500)
    mirrors["inference-worker-1"].write(41)  # killed after sending its 42nd token, before counting it
    live = {
        "policy-model-0": _live({"http://127.0.0.1:9100/v1": 300, "http://127.0.0.1:9101/v1": 30}),
        "policy-model-1": _live({"http://127.0.0.1:9100/v1": 200, "http://127.0.0.1:9101/v1": 12}),
        "simple-agent-0": {"worker_states": {"http://127.0.0.1:9101/v1": {"tokens_received": 1000}}},  # no model
    }
    assert delivered_by(live, "http://127.0.0.1:9101") == 42  # both models' counts, nobody else's
    assert delivered_by(live, "http://127.0.0.1:910") == 0  # a URL is matched whole, not as a prefix of another
    assert delivered_by({"policy-model": live["policy-model-0"]}, "http://127.0.0.1:9100") == 300  # one replica
    assert worker_tokens(state, tmp_path, group="inference-worker") == 541  # every worker by its own count
    assert (
        worker_tokens(state, tmp_path, {"inference-worker-1": 42}, group="inference-worker") == 542
    )  # the killed one as received


def test_the_demo_counts_what_every_policy_model_replica_received() -> None:
    live = {
        "policy-model-0": {"tokens_generated": 300, "tokens_reused": 7},
        "policy-model-1": {"tokens_generated": 212},
        "agent-ipi-0": {"tokens_generated": 1000},  # not a policy model
        "collection": {"episodes": 3},
    }
    assert model_tokens(live) == 512
    assert model_tokens({"policy-model": {"tokens_generated": 41}}) == 41
    assert model_tokens({}) == 0
