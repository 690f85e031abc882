"""An agent's kept finished results are bounded by age, count and bytes (results carry every call's token ids, so
1,024 of them held hundreds of MB in the soak, ``benchmarks/soak.py``), and are kept as one compact JSON ``bytes``
each."""

from __future__ import annotations

import pytest

from gym_services.agents.common.finished import FinishedEpisode, FinishedEpisodes


def done(rollout_id: str, size: int, at: float, attempt: int = 0) -> FinishedEpisode:
    """A kept episode whose boundary is ``size`` bytes of JSON."""
    head = b'{"name":"return","result":{"pad":"'
    return FinishedEpisode(rollout_id, attempt, head + b"x" * (size - len(head) - 3) + b'"}}', at)


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
    kept_episode = FinishedEpisode("r", 2, '{"name":"return","seq":7,"result":{"ids":[1,2],"text":"é"}}'.encode(), 0.0)
    assert kept_episode.size == len(kept_episode.boundary_json)
    assert kept_episode.boundary() == {"name": "return", "seq": 7, "result": {"ids": [1, 2], "text": "é"}}
    assert kept_episode.result() == {"ids": [1, 2], "text": "é"}
