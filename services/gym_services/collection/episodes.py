"""One episode's ``/run`` calls to its agent, and what an infrastructure failure means for them.

Infrastructure failures are not results. An agent that cannot be reached gets the same ``/run`` again after a
backoff; an agent that broke off the call (it died or the connection dropped) or answered ``503``
(``upstream_unavailable``, ``not_ready``: a server behind it stayed down past the agent's own deadline) gets the
episode again as attempt + 1, which fences whatever the older attempt left anywhere. Only when the failures last
``unavailable_deadline_s`` without a result is the outcome an error. A ``409 stale_attempt`` means a newer attempt
of the rollout runs elsewhere: the episode is superseded, and no row is written for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gym_services.base.backoff import Backoff
from gym_services.base.errors import ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.logs import get_logger
from gym_services.collection.models import EpisodeState

log = get_logger("collection")

#: the agent never received the call
UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: ``503`` codes that mean "a server was down", not "this episode failed"
INFRASTRUCTURE_CODES = frozenset({ErrorCode.UPSTREAM_UNAVAILABLE, ErrorCode.NOT_READY})


@dataclass(frozen=True)
class RetryPolicy:
    """How long an episode's infrastructure failures are waited out, and the waits between its calls."""

    backoff_s: float = 0.2
    backoff_max_s: float = 5.0
    unavailable_deadline_s: float = 900.0


@dataclass(frozen=True)
class Outcome:
    """How an episode's calls ended: its result, or the error its row says; superseded: no row at all."""

    result: dict[str, Any] | None = None
    error: str | None = None
    superseded: bool = False


def run_body(task: dict[str, Any], episode: EpisodeState) -> dict[str, Any]:
    """The ``/run`` body of an episode's current attempt: its task, stamped with the rollout's identity."""
    task = {k: v for k, v in task.items() if k not in ("agent", "agent_ref")}
    identity = RolloutIdentity(rollout_id=episode.rollout_id, attempt=episode.attempt)
    body = identity.stamp(task)
    body["_ng_task_index"] = episode.task_index
    body["_ng_rollout_index"] = episode.rollout_index
    return body


class EpisodeCalls:
    """The live episodes' ``/run`` calls, and the infrastructure failures they wait out meanwhile."""

    def __init__(self, policy: RetryPolicy, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.policy = policy
        self._sleep = sleep
        #: rollout id -> the infrastructure failure it waits out (retrying, not finished)
        self.retrying: dict[str, str] = {}
        #: the latest failure of an episode run again; none once an agent answers again
        self.last_failure: str | None = None

    def clear(self) -> None:
        self.retrying.clear()
        self.last_failure = None

    async def run(
        self,
        client: httpx.AsyncClient,
        url: str,
        episode: EpisodeState,
        body: Callable[[EpisodeState], dict[str, Any]],
        next_attempt: Callable[[EpisodeState], None],
    ) -> Outcome:
        """Call ``url`` (the agent's ``/run``) with ``body(episode)`` until the episode has an outcome; before
        running it again as a new attempt, ``next_attempt(episode)`` (which raises its attempt while it is live)."""
        policy = self.policy
        retry = Backoff(
            policy.backoff_s, policy.backoff_max_s, policy.unavailable_deadline_s, asyncio.get_running_loop().time
        )
        while True:
            error, rerun, outcome = await self._call(client, url, episode, body(episode))
            if outcome is not None:
                return outcome
            if not retry.failed():
                return Outcome(error=f"gave up after {retry.failing_s:.0f}s of infrastructure failures; last: {error}")
            backoff = retry.wait_s()
            log.warning(
                "episode hit an infrastructure failure; running it again",
                extra={
                    "rollout_id": episode.rollout_id,
                    "attempt": episode.attempt,
                    "error": error,
                    "next_attempt": rerun,
                    "retry_in_s": backoff,
                },
            )
            self.retrying[episode.rollout_id] = self.last_failure = f"{episode.rollout_id}: {error}"
            try:
                await self._sleep(backoff)
            finally:
                self.retrying.pop(episode.rollout_id, None)
            if rerun:
                next_attempt(episode)  # fences whatever the older attempt left on every server

    async def _call(
        self, client: httpx.AsyncClient, url: str, episode: EpisodeState, body: dict[str, Any]
    ) -> tuple[str, bool, Outcome | None]:
        """One ``/run``: its outcome, or the infrastructure failure and whether the next call is a new attempt."""
        try:
            resp = await client.post(url, json=body)
        except UNREACHABLE as exc:  # the agent never got the call: the same one again
            return f"agent {episode.agent} unreachable: {type(exc).__name__}: {exc}", False, None
        except httpx.TransportError as exc:  # broken off: the agent may have died mid-episode
            return f"agent {episode.agent} broke off /run: {type(exc).__name__}: {exc}", True, None
        data = _json(resp)
        if resp.status_code == 200:
            self.last_failure = None  # the agents answer again
            return "", False, Outcome(result=data)
        if resp.status_code == 409 and _code(data) == ErrorCode.STALE_ATTEMPT:
            return "", False, Outcome(superseded=True)  # a newer attempt elsewhere: not ours to report
        error = f"HTTP {resp.status_code}: {_code(data) or resp.text[:200]}"
        if _message(data):  # what went wrong, in the row: the run's logs may be gone when it is read
            error += f": {_message(data)}"
        if not (resp.status_code == 503 and _code(data) in INFRASTRUCTURE_CODES):
            return error, False, Outcome(error=error)  # the episode's own outcome: a result row, even if an error
        return error, True, None


def _message(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message", ""))[:1000]
    return ""


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _code(data: Any) -> str | None:
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
