"""Several inference workers behind one policy model: load spread by outstanding tokens, health checks,
and a worker killed mid-generation costing no episode and no token (real uvicorn workers, SIGKILL)."""

from __future__ import annotations

import asyncio
import random
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tests.services.models.policy_model.conftest import TOKENS_PER_SECOND
from tests.services.models.policy_model.model_support import (
    REQUESTS,
    ident,
    model_app,
    reference,
    wait_until,
    worker_tokens,
)
from tests.services.models.procs import ServerProcess, start_server
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import ConfigError, load_config
from gym_services.models.inference_worker.generation import read_token_mirror
from gym_services.models.policy_model.app import Config
from gym_services.models.policy_model.fleet import Fleet, Stream

WORKERS = 4
STREAMS = 64
RETRY = {"deadline_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.3}


# --- the choice among workers (no processes) ----------------------------------------------------


def test_new_streams_go_to_the_worker_with_the_fewest_outstanding_tokens() -> None:
    fleet = Fleet(["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"], expected_tokens=100)
    a, b = fleet.workers.values()
    long_one = fleet.open(fleet.pick(), fleet.expected(None, 0))
    assert long_one.worker is a
    assert fleet.pick() is b  # a has 100 outstanding, b none
    short = [fleet.open(b, 10), fleet.open(b, 10)]
    assert fleet.pick() is b  # two streams of 10 outstanding tokens weigh less than one of 100
    fleet.received(long_one, 95)  # nearly done: 5 left on a, 20 on b
    assert fleet.pick() is a
    for stream in short:
        fleet.close(stream)
    assert fleet.pick() is b
    assert fleet.expected(8, 0) == 8 and fleet.expected(None, 30) == 70


def test_a_workers_outstanding_tokens_are_kept_as_streams_open_move_and_close() -> None:
    """Kept as they change (no walk over every open stream): always the sum of the open streams' remaining tokens,
    a stream past its expected length counting 1, a token counted after its stream closed counting nothing."""
    rng = random.Random(3)
    fleet = Fleet(["http://127.0.0.1:9001/v1"], expected_tokens=50)
    (worker,) = fleet.workers.values()
    streams: list[Stream] = []
    closed: list[Stream] = []
    for _ in range(2000):
        move = rng.random()
        if move < 0.3 or not streams:
            streams.append(fleet.open(worker, rng.randrange(1, 80)))
        elif move < 0.85:
            fleet.received(rng.choice(streams), rng.randrange(1, 20))
        elif move < 0.95:
            stream = streams.pop(rng.randrange(len(streams)))
            fleet.close(stream, rng.choice([None, 10]))
            closed.append(stream)
        else:
            fleet.received(rng.choice(closed or streams), 3)  # a late count, or a counted stream
        assert worker.outstanding() == sum(max(1, s.expected - s.received) for s in streams)
    for stream in streams:
        fleet.close(stream)
        fleet.close(stream)  # twice: counted once
    assert worker.outstanding() == 0 and not worker.streams


def test_a_failed_worker_takes_no_stream_until_a_probe_finds_it_up() -> None:
    fleet = Fleet(["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"])
    a, b = fleet.workers.values()
    fleet.failed(a, "connection refused")
    assert [fleet.pick() for _ in range(3)] == [b, b, b]
    assert fleet.can_fail_over(a.base_url) and not fleet.can_fail_over(b.base_url)
    fleet.failed(b, "reset")
    assert fleet.pick() is a  # none up: the least recently failed one, after the generation's backoff
    fleet.probed(b, True)
    assert fleet.pick() is b and b.healthy and not a.healthy
    counts = fleet.counts()
    assert counts["workers"] == 2 and counts["workers_healthy"] == 1
    assert counts["worker_states"][a.base_url]["last_error"] == "connection refused"


async def test_resolve_turns_a_service_name_into_one_worker_per_address() -> None:
    answers = {"pool-a": ["127.0.0.1"], "pool-b": ["127.0.0.1"]}

    async def resolver(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError(f"{host}: name not known")
        return answers[host]

    fleet = Fleet(["http://pool-a:9001/v1", "http://pool-b:9002/v1"], resolve=True, resolver=resolver)
    assert fleet.workers == {}
    await fleet.refresh()
    assert sorted(fleet.workers) == ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]
    busy = fleet.open(fleet.workers["http://127.0.0.1:9002/v1"], 10)
    answers["pool-b"] = []  # its pod went away: no new stream, the open one goes on
    await fleet.refresh()
    assert [w.base_url for w in fleet.candidates()] == ["http://127.0.0.1:9001/v1"]
    assert "http://127.0.0.1:9002/v1" in fleet.workers
    fleet.close(busy)
    await fleet.refresh()
    assert sorted(fleet.workers) == ["http://127.0.0.1:9001/v1"]
    del answers["pool-a"]  # a DNS failure is not every worker gone
    await fleet.refresh()
    assert sorted(fleet.workers) == ["http://127.0.0.1:9001/v1"]


def test_fleet_configs_are_checked() -> None:
    ok = load_config(
        Config, overrides=base_config("policy_model", upstream={"base_url": "http://127.0.0.1:{8000..8003}/v1"})
    )
    assert len(Fleet(ok.upstream.base_url).workers) == 4
    for bad in (
        {"base_url": []},
        {"base_url": ["http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"]},
        {"base_url": "http://127.0.0.1:{3..1}/v1"},
        {"base_url": "ftp://127.0.0.1/v1"},
        {"base_url": "https://workers.example/v1", "resolve": True},
    ):
        with pytest.raises(ConfigError):
            load_config(Config, overrides=base_config("policy_model", upstream=bad))


async def test_the_fleet_counts_per_worker_exactly_the_tokens_the_worker_generated(fast_worker) -> None:
    """A worker's tokens_received (and finished_tokens) are the tokens it generated, whatever the stream's end:
    the final chunk restating a generation's tool calls, or one with a finish_reason, is no token of its own."""
    app = model_app(fast_worker.url)
    fleet = app.state.generations.upstream.fleet
    (worker,) = fleet.workers.values()
    calls = 0
    async with serve(app) as client:
        for kind in sorted(REQUESTS):
            before = await worker_tokens(fast_worker.url)
            received, finished = worker.tokens_received, worker.finished_tokens
            response = await client.post("/v1/responses", json=REQUESTS[kind], headers=ident(f"count-{kind}"))
            assert response.status_code == 200, response.text
            generated = await worker_tokens(fast_worker.url) - before
            assert generated == response.json()["usage"]["output_tokens"] > 0, kind
            assert (worker.tokens_received - received, worker.finished_tokens - finished) == (generated, generated), (
                kind
            )
            calls += any(item["type"] == "function_call" for item in response.json()["output"])
    assert calls  # a generation ending in tool calls was among them


# --- four real workers, one killed while 64 generations stream ---------------------------------


#: fresh fleets a kill may take before its precondition held (see the test)
ATTEMPTS = 3


@pytest.fixture
def fleet_workers(tmp_path: Path) -> Iterator[Callable[[], list[tuple[ServerProcess, Path]]]]:
    """Starts a fresh fleet of WORKERS real workers per call; every one is stopped at the end."""
    procs: list[tuple[ServerProcess, Path]] = []

    def start() -> list[tuple[ServerProcess, Path]]:
        fleet = len(procs) // WORKERS
        for i in range(WORKERS):
            mirror = tmp_path / f"fleet-{fleet}" / f"tokens-{i}" / "inference_worker.tokens"
            # half the usual pace: 64 streams take a while to start on a busy machine, and the victim should still
            # be generating once every one has (the pace makes it likely; the test checks that it was)
            config = {
                "tokens_per_second": TOKENS_PER_SECOND / 2,
                "time_to_first_token_s": 0.05,
                "stats_dir": str(mirror.parent),
            }
            procs.append(
                (start_server("inference_worker", config, tmp_path / f"fleet-{fleet}" / f"worker-{i}"), mirror)
            )
        return procs[-WORKERS:]

    try:
        yield start
    finally:
        for proc, _ in procs:
            proc.stop()


async def _kill_a_streaming_worker(workers: list[tuple[ServerProcess, Path]], fast_url: str) -> tuple[int, int]:
    """64 generations over the fleet, one worker SIGKILLed while it streams; every episode and token checked.

    Returns how many of the victim's generations the kill cut short and how many tokens of theirs another
    worker continued from: the kill can only be aimed (a worker writes ahead of what this process reads, and a
    loaded machine can hold this process back for seconds while the victim finishes its streams into the socket
    buffers), so whether it cut any generation short is known only afterwards. Everything else holds either way.
    """
    kinds = sorted(REQUESTS)
    expected = {kind: await reference(fast_url, REQUESTS[kind]) for kind in kinds}
    calls = [(f"r-{i}", kinds[i % len(kinds)]) for i in range(STREAMS)]
    total = sum(expected[kind]["usage"]["output_tokens"] for _, kind in calls)
    urls = [f"{proc.url}/v1" for proc, _ in workers]
    app = model_app(workers[0][0].url, upstream={"base_url": urls, "health_interval_s": 0.5}, upstream_retry=RETRY)
    victim, victim_mirror = workers[1]
    async with serve(app) as client:
        tasks = [
            asyncio.create_task(client.post("/v1/responses", json=REQUESTS[kind], headers=ident(rid)))
            for rid, kind in calls
        ]

        # every stream opened, and the victim generating by its own count: on a busy machine this process reads
        # behind the workers, which go on at their pace into the socket buffers (what it has read says little about
        # what they still do)
        fleet = app.state.generations.upstream.fleet
        deadline = asyncio.get_running_loop().time() + 60
        while sum(len(w.streams) + w.finished_streams for w in fleet.workers.values()) < STREAMS:
            assert asyncio.get_running_loop().time() < deadline, "the streams did not all open within 60 s"
            await asyncio.sleep(0.002)
        async with httpx.AsyncClient() as http:
            while (stats := (await http.get(f"{victim.url}/stats")).json())["tokens_generated"] < stats["requests"]:
                assert asyncio.get_running_loop().time() < deadline, stats  # (about a token per stream so far)
                await asyncio.sleep(0.002)
        spread = [len(w.streams) + w.finished_streams for w in fleet.workers.values()]  # every stream opened so far
        assert sum(spread) == STREAMS and max(spread) - min(spread) <= 1, spread  # balanced by outstanding tokens
        on_victim = len(fleet.workers[f"{victim.url}/v1"].streams) + fleet.workers[f"{victim.url}/v1"].finished_streams
        victim.kill()
        responses = await asyncio.wait_for(asyncio.gather(*tasks), 90)
        live = (await Control(client).status())["live"]
    for (rid, kind), response in zip(calls, responses, strict=True):
        assert response.status_code == 200, (rid, response.text)
        assert response.json() == expected[kind], rid  # as if no worker had died
    survivors = [await worker_tokens(proc.url) for proc, _ in workers if proc is not victim]
    killed = read_token_mirror(str(victim_mirror))
    dead = live["worker_states"][f"{victim.url}/v1"]
    # a generation of the victim may have finished between the look at its streams and the kill (the
    # machine is shared): those are no failover; every other one must be
    cut_short = on_victim - dead["finished_streams"]
    assert cut_short >= 0, dead
    # every token was generated once: what the dead worker streamed reached the policy model, and what it
    # streamed of the generations it did not finish is the prefix another worker continued
    assert sum(survivors) + dead["tokens_received"] == total, (survivors, killed, total, dead)
    # the dead worker's own count (its mirror file) agrees, but for the streams whose last token the kill caught
    # between reaching the socket and being counted: no sender can make the two one step, so what the policy model
    # received is the exact count (the fleet once counted the final chunk restating a generation's tool calls as
    # a token: 8 more than the mirror when 8 of the victim's generations ending in tool calls finished first)
    assert 0 <= dead["tokens_received"] - killed <= cut_short, (killed, dead)
    assert live["tokens_generated"] == total
    reused = dead["tokens_received"] - dead["finished_tokens"]
    assert live["tokens_reused"] == reused
    # every generation cut short on the dead worker failed over at once (no backoff), to a worker that was up
    assert live["failovers"] == live["upstream_failures"] == cut_short
    if cut_short:  # a failed stream marks its worker down at once (else only the next health probe does)
        assert live["workers_healthy"] == WORKERS - 1
        assert live["worker_states"][f"{victim.url}/v1"]["healthy"] is False
    return cut_short, reused


async def test_a_worker_killed_mid_generation_costs_no_episode_and_no_token(fleet_workers, fast_worker) -> None:
    """The kill must cut at least one generation short after the victim streamed some of it, or it proves no
    failover: whether it did is known only after the kill (see above), so a kill that missed (the victim had
    finished every stream, or only began ones it had not streamed yet) is repeated on a fresh fleet, a bounded
    number of times, each attempt checked in full; a miss is reported as a warning."""
    missed: list[tuple[int, int]] = []
    for _ in range(ATTEMPTS):
        cut_short, reused = await _kill_a_streaming_worker(fleet_workers(), fast_worker.url)
        if cut_short > 0 and reused > 0:
            break
        missed.append((cut_short, reused))
        warnings.warn(
            f"the worker kill cut short {cut_short} generations with {reused} tokens streamed: retrying on a fresh "
            "fleet",
            stacklevel=1,
        )
    else:
        pytest.fail(
            f"in {ATTEMPTS} attempts the kill never caught the victim mid-stream (cut short, tokens reused): {missed}"
        )


async def test_a_restarted_worker_is_taken_back_by_the_health_probe(tmp_path: Path) -> None:
    config = {"tokens_per_second": 0, "time_to_first_token_s": 0}
    first = start_server("inference_worker", config, tmp_path / "a")
    second = start_server("inference_worker", config, tmp_path / "b")
    port = int(second.url.rsplit(":", 1)[1])
    try:
        app = model_app(
            first.url, upstream={"base_url": [f"{first.url}/v1", f"{second.url}/v1"], "health_interval_s": 0.1}
        )
        async with serve(app) as client:
            fleet = app.state.generations.upstream.fleet
            second.kill()
            # the dead worker's port stays ours (bound, not listening: connections are refused) until it restarts:
            # a server another test starts meanwhile could get it and answer the probe (seen in CI: a probe found
            # "the worker" up, a generation went there and failed)
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", port))
            try:
                await wait_until(
                    lambda: fleet.counts()["workers_healthy"] == 1, what="the probe to find the worker down"
                )
                for i in range(4):  # every call goes to the live worker, none waits on the dead one
                    resp = await client.post("/v1/responses", json=REQUESTS["blackjack"], headers=ident(f"p-{i}"))
                    assert resp.status_code == 200
            finally:
                holder.close()
            second = start_server("inference_worker", config, tmp_path / "b2", port=port)
            await wait_until(lambda: fleet.counts()["workers_healthy"] == 2, what="the probe to find the worker up")
            live = (await Control(client).status())["live"]
            assert live["upstream_failures"] == 0  # the probe, not a generation, found it down
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{first.url}/stats")).json()["requests"] == 4
    finally:
        first.stop()
        second.stop()
