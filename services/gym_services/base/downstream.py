"""What an agent reports about the servers behind it, and what the collection reads of it.

An agent whose resources, environment or model server cannot be reached (or answers ``503`` without doing
anything) keeps its episodes at their boundaries and retries, for ``unavailable_deadline_s``; its ``/run``
answers nothing meanwhile. So that the cause is seen where the job is watched, every agent answers
``GET /health/downstream`` with a :class:`DownstreamReport`: the servers its episodes are waiting for right
now. The collection reads it from the agents running its live episodes and shows it in ``/jobs/current``
(``last_failure``, ``failing``); an empty report (the server is back) clears it.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

#: the agent route answering :class:`DownstreamReport`
DOWNSTREAM_PATH = "/health/downstream"


class DownstreamFailure(BaseModel):
    """One downstream call that episodes of an agent are retrying now."""

    model_config = ConfigDict(extra="forbid")

    server: str = Field(description="the agent's name for the server: model, resources or env")
    path: str = Field(description="the route the call goes to, e.g. /seed_session")
    reason: str = Field(
        description="unreachable (the call never got there), broke_off (the connection broke mid-call), "
        "the 503 code it answered, or gateway_502/503/504 (a proxy in between answered by itself)"
    )
    detail: str = Field(default="", max_length=500, description="the latest error, e.g. ConnectError: ...")
    since: float = Field(description="unix time of the first failure the waiting episodes hit")
    episodes: int = Field(ge=1, description="episodes of the agent waiting for it")

    def describe(self, now: float | None = None) -> str:
        """``resources /seed_session: unreachable since 10:41:03 UTC (45s; 3 episodes waiting)``."""
        waited = max(0.0, (time.time() if now is None else now) - self.since)
        clock = time.strftime("%H:%M:%S", time.gmtime(self.since))
        episodes = f"{self.episodes} {'episode' if self.episodes == 1 else 'episodes'} waiting"
        return f"{self.server} {self.path}: {self.reason} since {clock} UTC ({waited:.0f}s; {episodes})"


class DownstreamReport(BaseModel):
    """``GET /health/downstream`` of an agent: every downstream call its episodes are retrying, oldest first."""

    model_config = ConfigDict(extra="forbid")

    failing: list[DownstreamFailure] = Field(default_factory=list)
