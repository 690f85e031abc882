"""The participant set on its own: fan-out, the by-role order, pause leases, abort of a busy participant, matching a
checkpoint's participants. In process: real server apps over ASGI where a call goes out, plain values otherwise."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.services.coordination.recorders import ROLES, make_stack, phase_of
from tests.support.asgi import TOKEN, serve_many

from gym_services.control.models import (
    SCHEMA_VERSION,
    CaptureRequest,
    CheckpointRef,
    GlobalManifest,
    ManifestParticipant,
    PrepareRequest,
)
from gym_services.control.protocol import Role, Verb
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.coordination.participants import ParticipantSet, by_role
from gym_services.coordination.transaction import TransactionError


def refs_of(roles: dict[str, str]) -> list[ParticipantRef]:
    return [ParticipantRef(name, role, f"http://{name}") for name, role in roles.items()]


def test_roles_go_in_prepare_order_and_one_roles_participants_together() -> None:
    groups = by_role(refs_of(ROLES))
    assert [[r.participant_id for r in g] for g in groups] == [
        ["controller"],
        ["env-a"],
        ["model-a"],
        ["agent-a", "agent-b"],
        ["resources-a"],
    ]


def test_participant_ids_are_unique() -> None:
    twice = [*refs_of(ROLES), ParticipantRef("agent-a", Role.AGENT, "http://elsewhere")]
    with pytest.raises(ValueError, match="participant ids must be unique"):
        ParticipantSet(twice, ControlClient(TOKEN))


async def test_each_collects_answers_and_failures_and_all_fails_on_any() -> None:
    """Every call runs; a participant's error and any other exception are both failures of that participant."""
    participants = ParticipantSet(refs_of(ROLES), ControlClient(TOKEN))
    refs = participants.refs

    async def call(ref: ParticipantRef) -> CheckpointRef:
        if ref.participant_id == "agent-a":
            raise ParticipantError(ref, Verb.STATUS, "refused")
        if ref.participant_id == "model-a":
            raise RuntimeError("boom")
        return CheckpointRef(checkpoint_id=ref.participant_id)

    ok, failed = await participants.each(refs, Verb.STATUS, call)
    assert sorted(ok) == ["agent-b", "controller", "env-a", "resources-a"]
    assert ok["env-a"].checkpoint_id == "env-a"
    assert sorted(failed) == ["agent-a", "model-a"]
    assert str(failed["model-a"]) == "status on model model-a failed: RuntimeError: boom"
    with pytest.raises(TransactionError, match=r"agent agent-a failed: refused.*RuntimeError: boom"):
        await participants.all(refs, Verb.STATUS, call)
    assert await participants.all(refs[:1], Verb.STATUS, call) == {"resources-a": ok["resources-a"]}


def test_match_names_missing_participants_and_wrong_roles_in_manifest_order() -> None:
    participants = ParticipantSet(refs_of(ROLES), ControlClient(TOKEN))

    def manifest(entries: list[tuple[str, Role]]) -> GlobalManifest:
        return GlobalManifest(
            schema_version=SCHEMA_VERSION,
            checkpoint_id="ck",
            created_at=0.0,
            participants=[
                ManifestParticipant(
                    participant_id=pid,
                    role=role,
                    manifest_key=f"m/{pid}",
                    manifest_sha256="0" * 64,
                    manifest_size=1,
                    records=0,
                    bytes=0,
                )
                for pid, role in entries
            ],
        )

    matched = participants.match("ck", manifest([("model-a", Role.MODEL), ("controller", Role.CONTROLLER)]))
    assert [r.participant_id for r in matched] == ["model-a", "controller"]  # the manifest's order
    with pytest.raises(TransactionError, match=r"missing \['ghost'\], wrong role \['env-a'\]"):
        participants.match("ck", manifest([("ghost", Role.AGENT), ("env-a", Role.AGENT)]))


async def test_leases_are_renewed_while_held_and_run_out_after() -> None:
    """A participant prepared with a 0.4 s lease stays paused for 1.5 s while the set renews it, and reopens on its
    own once the renewal stops (nobody resumed it)."""
    apps, _parts, refs, _journal = make_stack()
    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        participants = ParticipantSet(refs, client)
        agent = next(r for r in refs if r.participant_id == "agent-a")
        async with participants.leases("ck-lease", lease_s=0.4) as touched:
            touched.append(agent)
            await client.prepare(agent, PrepareRequest(checkpoint_id="ck-lease", deadline_s=1, lease_s=0.4))
            await asyncio.sleep(1.5)
            held = await client.status(agent)
        for _ in range(100):
            reopened = await client.status(agent)
            if reopened.checkpoint_id is None:
                break
            await asyncio.sleep(0.05)
    assert held.checkpoint_id == "ck-lease" and not held.admission_open
    assert reopened.checkpoint_id is None and reopened.admission_open


async def test_resume_and_abort_reopen_the_servers_agents_call_before_the_agents_and_the_controller_last() -> None:
    apps, _parts, refs, journal = make_stack()
    recorders = [r for r in refs if r.participant_id in ROLES]
    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        participants = ParticipantSet(refs, client)
        for cid, finish in (("ck-r", participants.resume), ("ck-a", participants.abort)):
            req = PrepareRequest(checkpoint_id=cid, deadline_s=1, lease_s=30)
            await participants.all(recorders, Verb.PREPARE, lambda r, req=req: client.prepare(r, req))
            assert await finish(cid, recorders) == []
    for verb in ("resume", "abort"):
        order = phase_of(journal, verb)
        called = max(order.index(pid) for pid in ("env-a", "model-a", "resources-a"))
        assert called < min(order.index("agent-a"), order.index("agent-b"))
        assert max(order.index("agent-a"), order.index("agent-b")) < order.index("controller") == len(order) - 1


async def test_abort_asks_a_participant_still_capturing_again_until_it_can(tmp_path) -> None:
    """A participant refuses abort while its capture runs (the transaction stopped waiting for it): the set asks
    again, and the participant is aborted once its capture ends, well within the patience."""
    apps, parts, refs, journal = make_stack()
    agent = next(r for r in refs if r.participant_id == "agent-a")
    parts["agent-a"].gate = gate = asyncio.Event()
    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        participants = ParticipantSet(refs, client)
        await client.prepare(agent, PrepareRequest(checkpoint_id="ck-busy", deadline_s=1, lease_s=30))
        capture = asyncio.create_task(
            client.capture(agent, CaptureRequest(checkpoint_id="ck-busy", location=f"file://{tmp_path}"))
        )
        for _ in range(200):  # until the capture runs
            if any(line.startswith("capture agent-a") for line in journal):
                break
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().call_later(0.3, gate.set)
        started = time.monotonic()
        warnings = await participants.abort("ck-busy", [agent])
        took = time.monotonic() - started
        await capture
        status = await client.status(agent)
    assert warnings == [] and "abort agent-a" in journal
    assert 0.25 < took < 5, took  # it waited for the capture, and no longer than its patience
    assert status.checkpoint_id is None and status.admission_open
