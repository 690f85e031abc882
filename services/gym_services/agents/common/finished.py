"""An agent's recently finished episodes: kept for a while, at most so many and so many bytes.

A finished episode's result is kept after its ``/run`` answered, so a repeated ``/run`` of the same attempt
gets it again and a checkpoint whose scope still lists the rollout (its caller has not got the result yet)
saves it. Results carry every model call's token ids and log-probs, so their size varies by orders of
magnitude with the rollout. A kept episode is its ``return`` boundary as compact JSON, compressed, one ``bytes``
object: as Python objects (a list of ints and one of floats per call) the same result took 3-5 times the memory, in
millions of small blocks that, freed a minute later among younger ones, left the allocator's arenas holding
the space (in the soak, ``benchmarks/soak.py``, agent-ipi's resident memory grew by ~60 MB per 1,000 episodes,
almost all of it free but kept). The kept ones are bounded by age, count and bytes, oldest dropped first.

The token fields of each call are not in that JSON: a result's output items each carry their call's whole prompt,
so as text a result costs its turns times its context (at 32k-token contexts, a megabyte an episode, sixty
seconds' worth of finished episodes at once). They stay the episode's token arrays
(:mod:`gym_services.base.token_arrays`: each prompt shares the ids of the call before, 4 bytes an id), which the
JSON names by where they go; :meth:`FinishedEpisode.boundary` puts them back. What is left is mostly the task's
tools and instructions, echoed twice (the response and the create params), which zlib's fastest level makes 5 times
smaller in a fifth of a millisecond for a 32k context's 64 KB (read back only by a repeated ``/run`` or a checkpoint).
"""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import FIELDS

#: where a call's token fields go in a kept boundary: the keys and list indexes from its root to their dict
FieldPath = tuple[str | int, ...]
#: zlib's level for the kept JSON: the fastest (each episode's, on the event loop as it finishes)
LEVEL = 1


@dataclass(frozen=True)
class FinishedEpisode:
    """One finished attempt as kept: its ``return`` boundary as compact JSON compressed by zlib (``packed``), and each
    call's token arrays apart (``tokens``: where they go, and the three arrays in
    :data:`~gym_services.base.tokens.FIELDS` order)."""

    rollout_id: str
    attempt: int
    packed: bytes
    at: float
    tokens: tuple[tuple[FieldPath, tuple[TokenArray, ...]], ...] = ()
    #: the bytes of every token array it keeps alive (those its arrays share ids with too)
    token_bytes: int = field(init=False)
    #: the bytes it holds: its JSON and its token arrays
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_bytes", _held_bytes(self.tokens))
        object.__setattr__(self, "size", len(self.packed) + self.token_bytes)

    @classmethod
    def of(cls, rollout_id: str, attempt: int, boundary: dict[str, Any], at: float) -> FinishedEpisode:
        """Kept from ``boundary`` (a ``return`` boundary's Python values): every dict whose three token fields are
        token arrays keeps them apart, written in the JSON as empty lists."""
        tokens: list[tuple[FieldPath, tuple[TokenArray, ...]]] = []
        text = pydantic_core.to_json(_lift(boundary, (), tokens), inf_nan_mode="constants")
        return cls(rollout_id, attempt, zlib.compress(text, LEVEL), at, tuple(tokens))

    def boundary(self) -> dict[str, Any]:
        """The boundary as it was kept: JSON values, each call's token fields its token arrays again."""
        value = json.loads(zlib.decompress(self.packed))
        assert isinstance(value, dict)
        for path, arrays in self.tokens:
            node: Any = value
            for step in path:
                node = node[step]
            node.update(zip(FIELDS, arrays, strict=True))
        return value

    def result(self) -> dict[str, Any]:
        """What ``/run`` answered."""
        result = self.boundary()["result"]
        assert isinstance(result, dict)
        return result


def _lift(value: Any, path: FieldPath, tokens: list[tuple[FieldPath, tuple[TokenArray, ...]]]) -> Any:
    """``value`` with its containers copied and each call's token arrays taken out into ``tokens`` (an array anywhere
    else stays, and is written as the list it stands for)."""
    if isinstance(value, dict):
        arrays = tuple(value.get(name) for name in FIELDS)
        lifted = all(isinstance(a, TokenArray) for a in arrays)
        if lifted:
            tokens.append((path, arrays))  # type: ignore[arg-type]  # each one a TokenArray (checked)
        return {k: [] if lifted and k in FIELDS else _lift(v, (*path, k), tokens) for k, v in value.items()}
    if isinstance(value, list):
        return [_lift(v, (*path, i), tokens) for i, v in enumerate(value)]
    return value


def _held_bytes(tokens: tuple[tuple[FieldPath, tuple[TokenArray, ...]], ...]) -> int:
    """The bytes of every distinct array the token arrays hold, their bases' included."""
    seen: set[int] = set()
    total = 0
    for _, arrays in tokens:
        for array in arrays:
            node: TokenArray | None = array
            while node is not None:  # a chain is as long as the episode's calls: a few dozen at most
                if id(node.tail) not in seen:
                    seen.add(id(node.tail))
                    total += node.nbytes
                node = node.base
    return total


class FinishedEpisodes:
    """Finished episodes by rollout id, oldest first, with the bytes they hold counted."""

    def __init__(self, *, max_age_s: float, max_count: int, max_bytes: int) -> None:
        self.max_age_s, self.max_count, self.max_bytes = max_age_s, max_count, max_bytes
        self._kept: OrderedDict[str, FinishedEpisode] = OrderedDict()
        #: the size of every kept boundary, and the part of it that is token arrays
        self.bytes = 0
        self.token_bytes = 0

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
        self.token_bytes += episode.token_bytes
        self.prune(episode.at)

    def pop(self, rollout_id: str) -> FinishedEpisode | None:
        kept = self._kept.pop(rollout_id, None)
        if kept is not None:
            self.bytes -= kept.size
            self.token_bytes -= kept.token_bytes
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
            self.token_bytes -= oldest.token_bytes
