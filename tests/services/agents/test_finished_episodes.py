"""An agent's kept finished results are bounded by age, count and bytes (issue 29: results carry every call's token
ids, so 1,024 of them held hundreds of MB in the soak)."""

from __future__ import annotations

import pytest

from gym_services.agents.common.finished import FinishedEpisodes, json_size


def kept(finished: FinishedEpisodes[str]) -> list[str]:
    return list(finished.values())


def test_the_oldest_go_first_when_the_bytes_are_over() -> None:
    finished: FinishedEpisodes[str] = FinishedEpisodes(max_age_s=60, max_count=100, max_bytes=250)
    for i in range(4):
        finished.keep(f"r{i}", f"ep{i}", 100, now=float(i))
    assert kept(finished) == ["ep2", "ep3"] and finished.bytes == 200
    finished.keep("r4", "ep4", 50, now=4.0)
    assert kept(finished) == ["ep2", "ep3", "ep4"] and finished.bytes == 250


def test_a_result_larger_than_the_bound_alone_is_not_kept_and_drops_nothing() -> None:
    finished: FinishedEpisodes[str] = FinishedEpisodes(max_age_s=60, max_count=100, max_bytes=250)
    finished.keep("r0", "ep0", 100, now=0.0)
    finished.keep("big", "huge", 251, now=1.0)
    assert kept(finished) == ["ep0"] and "big" not in finished and finished.bytes == 100


def test_count_age_and_pop_keep_the_byte_count_exact() -> None:
    finished: FinishedEpisodes[str] = FinishedEpisodes(max_age_s=10, max_count=2, max_bytes=10_000)
    finished.keep("a", "A", 10, now=0.0)
    finished.keep("b", "B", 20, now=5.0)
    finished.keep("c", "C", 30, now=6.0)  # over the count: a goes
    assert kept(finished) == ["B", "C"] and finished.bytes == 50
    finished.keep("b", "B2", 5, now=7.0)  # the same rollout again: replaced, now the newest
    assert kept(finished) == ["C", "B2"] and finished.bytes == 35
    assert finished.pop("c") == "C" and finished.pop("c") is None and finished.bytes == 5
    finished.prune(now=17.5)  # B2 finished at 7: older than 10 s
    assert len(finished) == 0 and finished.bytes == 0


@pytest.mark.parametrize("bounds", [{"max_count": 0}, {"max_age_s": 0}])
def test_keeping_off_keeps_nothing(bounds) -> None:
    finished: FinishedEpisodes[str] = FinishedEpisodes(**{"max_age_s": 60, "max_count": 5, "max_bytes": 100, **bounds})
    finished.keep("a", "A", 1, now=0.0)
    assert len(finished) == 0 and finished.bytes == 0


def test_json_size_is_the_compact_encoding() -> None:
    assert json_size({"ids": [1, 2, 3], "text": "é"}) == len('{"ids":[1,2,3],"text":"é"}')
