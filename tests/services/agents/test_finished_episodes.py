"""An agent's kept finished results are bounded by age, count and bytes (results carry every call's token ids, so
1,024 of them held hundreds of MB in the soak, ``benchmarks/soak.py``), and are kept as one compact JSON ``bytes``
each, with each call's token fields apart as the episode's token arrays."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from gym_services.agents.common.downstream import json_bytes
from gym_services.agents.common.finished import FinishedEpisode, FinishedEpisodes
from gym_services.agents.common.records import EPISODE_ENCODER, EpisodeLog, FrozenChunk, decode_chunks
from gym_services.agents.common.tokens import EpisodeTokens
from gym_services.agents.simple_agent.loop import SimpleBoundary
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import FIELDS


def done(rollout_id: str, size: int, at: float, attempt: int = 0) -> FinishedEpisode:
    """A kept episode of ``size`` bytes (what the bounds count; never read back here)."""
    return FinishedEpisode(rollout_id, attempt, b"x" * size, at)


def kept(finished: FinishedEpisodes) -> list[str]:
    return [f"{e.rollout_id}/{e.attempt}" for e in finished.values()]


def test_the_oldest_go_first_when_the_bytes_are_over() -> None:
    finished = FinishedEpisodes(max_age_s=60, max_count=100, max_bytes=250)
    for i in range(4):
        finished.keep(done(f"r{i}", 100, at=float(i)))
    assert kept(finished) == ["r2/0", "r3/0"] and finished.bytes == 200
    finished.keep(done("r4", 50, at=4.0))
    assert kept(finished) == ["r2/0", "r3/0", "r4/0"] and finished.bytes == 250


def test_a_result_larger_than_the_bound_alone_is_not_kept_and_drops_nothing() -> None:
    finished = FinishedEpisodes(max_age_s=60, max_count=100, max_bytes=250)
    finished.keep(done("r0", 100, at=0.0))
    finished.keep(done("big", 251, at=1.0))
    assert kept(finished) == ["r0/0"] and "big" not in finished and finished.bytes == 100


def test_count_age_and_pop_keep_the_byte_count_exact() -> None:
    finished = FinishedEpisodes(max_age_s=10, max_count=2, max_bytes=10_000)
    finished.keep(done("a", 50, at=0.0))
    finished.keep(done("b", 60, at=5.0))
    finished.keep(done("c", 70, at=6.0))  # over the count: a goes
    assert kept(finished) == ["b/0", "c/0"] and finished.bytes == 130
    finished.keep(done("b", 45, at=7.0, attempt=1))  # the same rollout again: replaced, now the newest
    assert kept(finished) == ["c/0", "b/1"] and finished.bytes == 115
    popped = finished.pop("c")
    assert popped is not None and popped.size == 70 and finished.pop("c") is None and finished.bytes == 45
    finished.prune(now=17.5)  # b finished at 7: older than 10 s
    assert len(finished) == 0 and finished.bytes == 0


@pytest.mark.parametrize("bounds", [{"max_count": 0}, {"max_age_s": 0}])
def test_keeping_off_keeps_nothing(bounds) -> None:
    finished = FinishedEpisodes(**{"max_age_s": 60, "max_count": 5, "max_bytes": 100, **bounds})
    finished.keep(done("a", 50, at=0.0))
    assert len(finished) == 0 and finished.bytes == 0


def test_a_kept_episode_gives_back_its_boundary_and_result() -> None:
    kept_episode = FinishedEpisode.of("r", 2, {"name": "return", "seq": 7, "result": {"ids": [1, 2], "text": "é"}}, 0.0)
    assert kept_episode.size == len(kept_episode.packed)
    assert kept_episode.boundary() == {"name": "return", "seq": 7, "result": {"ids": [1, 2], "text": "é"}}
    assert kept_episode.result() == {"ids": [1, 2], "text": "é"}


def finished_boundary(turns: int) -> tuple[dict[str, Any], EpisodeTokens]:
    """A ``return`` boundary as an agent keeps it (``model_dump`` of the boundary its episode recorded): the verify
    answer's response with a function call item per turn, each call's prompt the whole context so far (500 ids of
    tools and prompt, then 100 ids a turn) with its token fields the episode's arrays; and the episode's table."""
    tokens = EpisodeTokens()
    context = list(range(50_000, 50_500))
    output = []
    for turn in range(turns):
        generated = list(range(60_000 + 10 * turn, 60_010 + 10 * turn))
        log_probs = [-0.5 - i / 64 for i in range(10)]
        tokens.add(list(context), generated, log_probs)  # as the episode's generate step does, call by call
        output.append(
            {"type": "function_call", "call_id": f"c{turn}", "name": "t", "arguments": "{}", "status": "completed"}
            | dict(zip(FIELDS, (list(context), generated, log_probs), strict=True))
        )
        context += generated + list(range(70_000 + 90 * turn, 70_090 + 90 * turn))
    result = {"response": {"id": "r", "output": output, "tools": [{"name": "t", "x": 1.5e-7}]}, "reward": 1.0}
    boundary = {"name": "return", "seq": 2 * turns, "row": {}, "cookies": {"model": {"s": "é"}}, "result": result}
    tokens.intern(boundary)  # as Episode.record does: the lists become the episode's arrays
    return boundary, tokens


def test_a_kept_result_holds_the_episodes_token_arrays_not_their_text() -> None:
    """Each output item carries its call's whole prompt: as text, a result costs its turns times its context. Kept,
    the JSON has no token in it, the arrays are the episode's own (each prompt sharing the call before's ids), its size
    counts each distinct id once, and what ``/run`` answers from it is byte for byte what it answered before."""
    boundary, tokens = finished_boundary(8)
    as_text = json_bytes(boundary)  # what the kept bytes were: every prompt's ids written out
    kept = FinishedEpisode.of("r", 3, boundary, 0.0)
    text = zlib.decompress(kept.packed)
    assert b"50499" not in text and b"60000" not in text and len(kept.packed) * 3 < len(text)
    arrays = [t.arrays() for t in tokens.triples if t is not None]
    assert [a for _, a in kept.tokens] == arrays
    distinct = sum(a.nbytes for triple in arrays for a in triple)  # each prompt holds only the ids it adds
    assert kept.size == len(kept.packed) + distinct
    assert kept.size * 4 < len(as_text)
    back = kept.boundary()
    assert all(
        item[name] is array
        for item, triple in zip(back["result"]["response"]["output"], arrays, strict=True)
        for name, array in zip(FIELDS, triple, strict=True)
    )
    assert json_bytes(kept.result()) == json_bytes(json.loads(as_text)["result"])
    assert json_bytes(back) == as_text


def test_the_token_bytes_kept_are_counted_apart_and_exactly() -> None:
    """``token_bytes`` is the arrays' part of ``size``; the collection's count follows keep, replace, pop and prune
    (the agent's ``gym_agent_token_bytes{episodes="finished"}``)."""
    results = {n: FinishedEpisode.of(f"r{n}", 0, finished_boundary(n)[0], float(n)) for n in (2, 5, 8)}
    for n, kept_episode in results.items():
        assert 0 < kept_episode.token_bytes == kept_episode.size - len(kept_episode.packed)
        assert kept_episode.token_bytes == sum(a.nbytes for _, arrays in kept_episode.tokens for a in arrays)
        assert n == 2 or kept_episode.token_bytes > results[2].token_bytes
    finished = FinishedEpisodes(max_age_s=10, max_count=2, max_bytes=10**9)
    for kept_episode in results.values():
        finished.keep(kept_episode)  # over the count: r2 goes
    assert finished.token_bytes == results[5].token_bytes + results[8].token_bytes
    finished.keep(FinishedEpisode("r5", 1, b"{}", 9.0))  # a newer attempt of r5 without tokens replaces it
    assert finished.token_bytes == results[8].token_bytes
    finished.pop("r8")
    assert finished.token_bytes == 0
    finished.keep(results[8])
    finished.prune(now=30.0)
    assert len(finished) == 0 and finished.token_bytes == 0 and finished.bytes == 0


def test_token_arrays_outside_a_calls_fields_are_kept_as_their_lists() -> None:
    """Only a dict with all three token fields as arrays is taken apart; an array elsewhere is written as its list."""
    stray = TokenArray.of([5, 6, 7])
    kept = FinishedEpisode.of("r", 0, {"name": "return", "result": {"ids": stray, "prompt_token_ids": stray}}, 0.0)
    assert kept.tokens == () and kept.boundary() == {
        "name": "return",
        "result": {"ids": [5, 6, 7], "prompt_token_ids": [5, 6, 7]},
    }


def test_a_kept_result_in_a_checkpoint_reads_back_as_it_was_kept() -> None:
    """A finished episode whose result the controller still waits for is one chunk, made from what it kept: its
    token arrays written as the chunk's own calls; read back, the same boundary, byte for byte."""
    boundary, _ = finished_boundary(5)
    kept = FinishedEpisode.of("r", 1, boundary, 0.0)
    chunk = EPISODE_ENCODER.encode(FrozenChunk(EpisodeLog(), finished=kept.boundary, boundary_model=SimpleBoundary))
    read = SimpleBoundary.model_validate(decode_chunks([chunk], EpisodeTokens()))
    made = SimpleBoundary.model_validate(json.loads(json_bytes(boundary)))
    assert json_bytes(read.model_dump()) == json_bytes(made.model_dump())
    assert len(chunk) * 3 < len(json_bytes(boundary))  # each id once in the chunk too
