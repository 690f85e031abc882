"""An agent's recently finished episodes: kept for a while, at most so many and so many bytes.

A finished episode's result is kept after its ``/run`` answered, so a repeated ``/run`` of the same attempt
gets it again and a checkpoint whose scope still lists the rollout (its caller has not got the result yet)
saves it. Results carry every model call's token ids and log-probs, so their size varies by orders of
magnitude with the rollout. A kept episode is its ``return`` boundary as compact JSON, one ``bytes`` object:
as Python objects (a list of ints and one of floats per call) the same result took 3-5 times the memory, in
millions of small blocks that, freed a minute later among younger ones, left the allocator's arenas holding
the space (in the soak, ``benchmarks/soak.py``, agent-ipi's resident memory grew by ~60 MB per 1,000 episodes,
almost all of it free but kept). The kept ones are bounded by age, count and bytes, oldest dropped first.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FinishedEpisode:
    """One finished attempt as kept: its ``return`` boundary as compact JSON."""

    rollout_id: str
    attempt: int
    boundary_json: bytes
    at: float

    @property
    def size(self) -> int:
        return len(self.boundary_json)

    def boundary(self) -> dict[str, Any]:
        """The boundary as JSON values (what an episode record holds)."""
        value = json.loads(self.boundary_json)
        assert isinstance(value, dict)
        return value

    def result(self) -> dict[str, Any]:
        """What ``/run`` answered."""
        result = self.boundary()["result"]
        assert isinstance(result, dict)
        return result


class FinishedEpisodes:
    """Finished episodes by rollout id, oldest first, with the bytes they hold counted."""

    def __init__(self, *, max_age_s: float, max_count: int, max_bytes: int) -> None:
        self.max_age_s, self.max_count, self.max_bytes = max_age_s, max_count, max_bytes
        self._kept: OrderedDict[str, FinishedEpisode] = OrderedDict()
        #: the size of every kept boundary
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._kept

    def get(self, rollout_id: str) -> FinishedEpisode | None:
        return self._kept.get(rollout_id)

    def values(self) -> Iterator[FinishedEpisode]:
        return iter(self._kept.values())

    @property
    def keeps(self) -> bool:
        """False when keeping is off (an age or count bound of 0)."""
        return self.max_count > 0 and self.max_age_s > 0

    def keep(self, episode: FinishedEpisode) -> None:
        """Keep ``episode`` (the newest), then drop the oldest past any bound; nothing is kept when keeping is off
        or the episode alone is over the byte bound."""
        self.pop(episode.rollout_id)
        if not self.keeps or episode.size > self.max_bytes:
            return
        self._kept[episode.rollout_id] = episode
        self.bytes += episode.size
        self.prune(episode.at)

    def pop(self, rollout_id: str) -> FinishedEpisode | None:
        kept = self._kept.pop(rollout_id, None)
        if kept is not None:
            self.bytes -= kept.size
        return kept

    def prune(self, now: float) -> None:
        """Drop the oldest until every bound holds: age, count, bytes."""
        cutoff = now - self.max_age_s
        while self._kept:
            oldest = next(iter(self._kept.values()))
            if len(self._kept) <= self.max_count and self.bytes <= self.max_bytes and oldest.at >= cutoff:
                return
            self._kept.popitem(last=False)
            self.bytes -= oldest.size
