"""The downstream calls an agent's episodes are retrying (a server unreachable or down), and the report of them
(``GET /health/downstream``) that lets the collection say why nothing finishes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gym_services.agents.common.downstream import DownstreamUnavailable
from gym_services.base.downstream import DownstreamFailure, DownstreamReport


@dataclass
class Waiting:
    """The downstream call an episode is retrying: where, why, since when (unix time) and the latest failure."""

    server: str
    path: str
    reason: str
    detail: str
    since: float
    at: float


class WaitingEpisodes:
    """Episode -> the downstream call it is retrying now."""

    def __init__(self) -> None:
        self._waiting: dict[object, Waiting] = {}

    def note(self, episode: object, exc: DownstreamUnavailable) -> None:
        """The episode's call failed again: since when it waits (its first failure on the same server and route)."""
        now = time.time()
        previous = self._waiting.get(episode)
        same = previous is not None and (previous.server, previous.path) == (exc.server, exc.path)
        since = previous.since if same and previous is not None else now
        self._waiting[episode] = Waiting(exc.server, exc.path, exc.reason, exc.detail, since, now)

    def clear(self, episode: object) -> None:
        """The episode no longer waits (its step went through, or it ended)."""
        self._waiting.pop(episode, None)

    def report(self) -> DownstreamReport:
        """The downstream calls episodes are retrying now, one entry per server and route, oldest first."""
        groups: dict[tuple[str, str], list[Waiting]] = {}
        for waiting in self._waiting.values():
            groups.setdefault((waiting.server, waiting.path), []).append(waiting)
        failing = []
        for (server, path), waits in groups.items():
            latest = max(waits, key=lambda w: w.at)
            failing.append(
                DownstreamFailure(
                    server=server,
                    path=path,
                    reason=latest.reason,
                    detail=latest.detail[:500],
                    since=min(w.since for w in waits),
                    episodes=len(waits),
                )
            )
        return DownstreamReport(failing=sorted(failing, key=lambda f: f.since))
