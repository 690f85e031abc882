"""A whole stack in process (model, agent, resources or environment) and the checkpoint scenario.

The scenario every agent test follows: run an episode as attempt 0, let it reach a
position, checkpoint the whole stack with the coordinator, retire attempt 0, restore
into fresh instances of every server, and run attempt 1 there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from tests.services.agents.wire import Wire, running
from tests.support.asgi import TOKEN, Control

from gym_services.agents.common import AgentParticipant
from gym_services.control.models import Role
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionResult

#: builds the apps of one stack: name -> (role, app); agents route downstream calls through ``wire``;
#: role None marks a backend that is not a checkpoint participant (the Lean sandbox stand-in)
StackFactory = Callable[[Wire], dict[str, tuple[Role | None, Starlette]]]


@dataclass
class Stack:
    wire: Wire
    roles: dict[str, Role]
    agent: str
    http: httpx.AsyncClient
    coordinator: Coordinator

    @property
    def agent_app(self) -> Starlette:
        return self.wire.apps[self.agent]

    @property
    def participant(self) -> AgentParticipant:
        return self.agent_app.state.agent

    def control(self, name: str) -> Control:
        return Control(httpx.AsyncClient(transport=self.wire, base_url=f"http://{name}"))

    async def status(self, name: str) -> dict:
        return (
            await self.http.get(
                f"http://{name}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {TOKEN}"}
            )
        ).json()

    async def run(self, row: dict[str, Any], rollout_id: str | None, attempt: int = 0) -> httpx.Response:
        body = dict(row)
        if rollout_id is not None:
            body.update({"_ng_rollout_id": rollout_id, "_ng_attempt_index": attempt})
        return await self.http.post(f"http://{self.agent}/run", json=body, timeout=60)


@contextlib.asynccontextmanager
async def stack(factory: StackFactory, agent: str = "agent") -> AsyncIterator[Stack]:
    wire = Wire()
    built = factory(wire)
    wire.apps.update({name: app for name, (_, app) in built.items()})
    roles = {name: role for name, (role, _) in built.items() if role is not None}
    refs = [ParticipantRef(name, role, f"http://{name}") for name, role in roles.items()]
    async with running(wire):
        client = ControlClient(TOKEN, transport=wire)
        async with httpx.AsyncClient(transport=wire, timeout=60) as http:
            try:
                yield Stack(wire, roles, agent, http, Coordinator(refs, client))
            finally:
                await client.aclose()


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def agent_blocked(s: Stack) -> bool:
    """The agent is preparing and reports an episode inside a waited step."""
    status = await s.status(s.agent)
    return status["phase"] == "preparing" and any(b["kind"] == "episode" for b in status["blockers"])


@dataclass
class Outcome:
    """What the scenario observed."""

    result: dict[str, Any]
    checkpoint: TransactionResult
    restore: TransactionResult
    first_run: httpx.Response
    retired: dict[str, bool]
    restored_wire: Wire
    agent_status_after_retire: dict
    history: list[str] = field(default_factory=list)
    late: httpx.Response | None = None


async def checkpoint_and_continue(
    factory: StackFactory,
    row: dict[str, Any],
    rollout_id: str,
    location: str,
    *,
    arrange: Callable[[Stack], Awaitable[Callable[[], Awaitable[None]]]],
    during_prepare: Callable[[Stack], Awaitable[None]] | None = None,
    after_checkpoint: Callable[[Stack], Awaitable[None]] | None = None,
    checkpoint_id: str = "ck-1",
) -> Outcome:
    """Attempt 0 reaches a position, the stack is checkpointed, attempt 0 retired, attempt 1 restored.

    ``arrange(stack)`` places holds before ``/run`` and returns a coroutine function that
    waits until the position is reached; ``during_prepare`` runs while the coordinator
    prepares (e.g. releases a held waited step once the agent reports it as a blocker).
    """
    async with stack(factory) as first:
        reached = await arrange(first)
        run0 = asyncio.create_task(first.run(row, rollout_id, 0))
        await asyncio.wait_for(reached(), 10)
        helper = asyncio.create_task(during_prepare(first)) if during_prepare else None
        checkpoint = await first.coordinator.checkpoint(checkpoint_id, location, prepare_timeout_s=10)
        assert checkpoint.status == "completed", checkpoint.error
        if helper is not None:
            await helper
        if after_checkpoint is not None:
            await after_checkpoint(first)
        retired = await first.coordinator.retire(rollout_id, 0)
        first_run = await asyncio.wait_for(run0, 10)
        after_retire = await first.status(first.agent)
        for hold in first.wire.holds:
            hold.release.set()  # nothing may be left waiting on a hold

    async with stack(factory) as second:
        restore = await second.coordinator.restore(checkpoint_id, location)
        assert restore.status == "completed", restore.error
        assert restore.episodes.get(rollout_id) == 1, restore.episodes
        # a late /run of the old attempt is refused and changes nothing
        before = second.participant.describe(rollout_id)
        downstream_before = [c for c in second.wire.calls if c.host != second.agent]
        late = await second.run(row, rollout_id, 0)
        old = {"x-ng-rollout-id": rollout_id, "x-ng-attempt": "0"}
        late_proxy = await second.http.post(f"http://{second.agent}/v1/responses", json={"input": "hi"}, headers=old)
        assert late_proxy.status_code == 409 and late_proxy.json()["error"]["code"] == "stale_attempt"
        assert second.participant.describe(rollout_id) == before
        assert [c for c in second.wire.calls if c.host != second.agent] == downstream_before
        reply = await second.run(row, rollout_id, 1)
        assert reply.status_code == 200, reply.text
        history = list(second.participant.last_history.get(rollout_id, []))
        return Outcome(
            result=reply.json(),
            checkpoint=checkpoint,
            restore=restore,
            first_run=first_run,
            retired=retired,
            restored_wire=second.wire,
            agent_status_after_retire=after_retire,
            history=history,
            late=late,
        )


async def uninterrupted(factory: StackFactory, row: dict[str, Any], rollout_id: str) -> tuple[dict[str, Any], Wire]:
    async with stack(factory) as s:
        reply = await s.run(row, rollout_id, 0)
        assert reply.status_code == 200, reply.text
        return reply.json(), s.wire
