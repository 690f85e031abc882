"""How the demo counts the tokens of an inference worker SIGKILLed mid-stream.

A sender cannot make "the token's bytes reached the kernel" and "the token was counted" one step, so a
killed worker's own count (its token mirror) can be one short per stream it was writing when the kill
landed. The demo therefore counts a killed worker by what the policy models received from it, and every
live worker by its own count. A CI run under load once reported "-1 tokens regenerated" from the mirror.
"""

from __future__ import annotations

from pathlib import Path

from gym_services.demo.story import _worker_tokens, delivered_by
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
    assert _worker_tokens(state, tmp_path) == 541  # every worker by its own count
    assert _worker_tokens(state, tmp_path, {"inference-worker-1": 42}) == 542  # the killed one as received
