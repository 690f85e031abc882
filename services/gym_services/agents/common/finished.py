"""An agent's recently finished episodes: kept for a while, at most so many and so many bytes.

A finished episode's result is kept after its ``/run`` answered, so a repeated ``/run`` of the same attempt
gets it again and a checkpoint whose scope still lists the rollout (its caller has not got the result yet)
saves it. Results carry every model call's token ids and log-probs, so their size varies by orders of
magnitude with the rollout; the kept ones are bounded by age, count and bytes (their JSON size), oldest
dropped first.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

E = TypeVar("E")


@dataclass(frozen=True)
class _Kept(Generic[E]):
    episode: E
    size: int
    at: float


class FinishedEpisodes(Generic[E]):
    """Finished episodes by rollout id, oldest first, with the bytes of their results counted."""

    def __init__(self, *, max_age_s: float, max_count: int, max_bytes: int) -> None:
        self.max_age_s, self.max_count, self.max_bytes = max_age_s, max_count, max_bytes
        self._kept: OrderedDict[str, _Kept[E]] = OrderedDict()
        #: the JSON size of every kept result
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._kept

    def get(self, rollout_id: str) -> E | None:
        kept = self._kept.get(rollout_id)
        return None if kept is None else kept.episode

    def values(self) -> Iterator[E]:
        return (kept.episode for kept in self._kept.values())

    @property
    def keeps(self) -> bool:
        """False when keeping is off (an age or count bound of 0)."""
        return self.max_count > 0 and self.max_age_s > 0

    def keep(self, rollout_id: str, episode: E, size: int, now: float) -> None:
        """Keep ``episode`` (the newest), its result ``size`` bytes, then drop the oldest past any bound; nothing is
        kept when keeping is off or the result alone is over the byte bound."""
        self.pop(rollout_id)
        if not self.keeps or size > self.max_bytes:
            return
        self._kept[rollout_id] = _Kept(episode, size, now)
        self.bytes += size
        self.prune(now)

    def pop(self, rollout_id: str) -> E | None:
        kept = self._kept.pop(rollout_id, None)
        if kept is None:
            return None
        self.bytes -= kept.size
        return kept.episode

    def prune(self, now: float) -> None:
        """Drop the oldest until every bound holds: age, count, bytes."""
        cutoff = now - self.max_age_s
        while self._kept:
            oldest = next(iter(self._kept.values()))
            if len(self._kept) <= self.max_count and self.bytes <= self.max_bytes and oldest.at >= cutoff:
                return
            self._kept.popitem(last=False)
            self.bytes -= oldest.size


def json_size(value: object) -> int:
    """The size of ``value`` as compact JSON: about what keeping it costs, and what answering it sends."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))
