"""In-process participants for the coordination tests: a recorder of any role that logs every verb into a shared
journal, the stack of six recorders and the counter resources server, and a coordinator over them.

Real server apps (the app factory, the control plane, the control routes) served in process through ASGI; only the
participant behind the plane is the recorder.
"""

from __future__ import annotations

import asyncio
import json
from typing import Never

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import TOKEN, base_config, serve_many

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.models import Blocker
from gym_services.control.participant import InvalidState, Participant, Record
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app
from gym_services.server.app import create_server_app

#: the recorders of :func:`make_stack`: name -> role
ROLES = {
    "resources-a": "resources",
    "agent-a": "agent",
    "controller": "controller",
    "model-a": "model",
    "env-a": "environment",
    "agent-b": "agent",
}


class Recorder(Participant[list[str], Never]):
    """A participant of any role that logs every verb into a shared journal."""

    def __init__(self, name: str, role: str, journal: list[str]) -> None:
        self.name, self.journal = name, journal
        self.role = role
        self.block = False
        self.fail_export = False
        self.fail_validate = False
        self.installed: list[str] = []
        self.episodes = ["r1", "r2"] if role == "controller" else []
        self.gate: asyncio.Event | None = None  # when set to an event, a capture waits for it

    def blockers(self):
        return [Blocker(kind="episode", id="r9", detail="tool call running")] if self.block else []

    async def prepare(self, checkpoint_id):
        self.journal.append(f"prepare {self.name}")

    async def export(self, scope):
        self.journal.append(
            f"capture {self.name} scope={sorted(scope.episodes) if scope.episodes is not None else None}"
        )
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_export:
            raise InvalidState("disk on fire")
        return [Record(f"episode-{e}", json.dumps({"e": e}).encode(), e, 0) for e in self.episodes]

    async def validate(self, records):
        if self.fail_validate:
            raise InvalidState("bad record")
        return [r.key for r in records]

    async def install(self, validated):
        self.journal.append(f"install {self.name}")
        self.installed = list(validated)

    async def uninstall(self, validated):
        self.journal.append(f"uninstall {self.name}")
        self.installed = []

    async def resume(self):
        self.journal.append(f"resume {self.name}")

    async def abort(self):
        self.journal.append(f"abort {self.name}")

    async def retire(self, rollout_id, attempt):
        self.journal.append(f"retire {self.name}")
        return True


def recorder_app(name: str, role: str, journal: list[str]):
    participant = Recorder(name, role, journal)

    async def ping(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    cfg = load_config(ServerConfig, overrides=base_config(name))
    return create_server_app(cfg, participant, [Route("/ping", ping, methods=["POST"])]), participant


def make_stack():
    """The six recorders of :data:`ROLES` and the counter: (apps, participants, refs, journal)."""
    journal: list[str] = []
    apps, parts, refs = {}, {}, []
    for name, role in ROLES.items():
        apps[name], parts[name] = recorder_app(name, role, journal)
        refs.append(ParticipantRef(name, role, f"http://{name}"))
    apps["counter"] = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    refs.append(ParticipantRef("counter", "resources", "http://counter"))
    return apps, parts, refs, journal


def fresh_stack(refs, journal: list[str]):
    """New app instances for the same participants, as fresh processes would be."""
    apps, parts = {}, {}
    for ref in refs:
        if ref.participant_id == "counter":
            apps["counter"] = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
        else:
            apps[ref.participant_id], parts[ref.participant_id] = recorder_app(ref.participant_id, ref.role, journal)
    return apps, parts


async def run(stack, fn):
    apps, _parts, refs, _journal = stack
    async with serve_many(apps) as transport:
        client = ControlClient(TOKEN, transport=transport)
        events: list[str] = []
        coordinator = Coordinator(refs, client, on_event=lambda phase, detail: events.append(phase))
        try:
            return await fn(coordinator, transport, events)
        finally:
            await client.aclose()


def phase_of(journal, verb):
    return [line.split()[1] for line in journal if line.startswith(verb)]
