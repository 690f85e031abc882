"""Replicas: each is its own participant, a checkpoint needs every one of them, and a restore maps each
checkpointed replica to the one of the same ordinal and refuses other replica counts."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from tests.services.coordination.recorders import recorder_app
from tests.support.asgi import TOKEN, serve_many

from gym_services.control import layout
from gym_services.control.models import Replica
from gym_services.control.storage import open_storage
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionError, check_replica_sets


def replicated(counts: dict[str, tuple[str, int]]) -> tuple[dict, dict, list[ParticipantRef], list[str]]:
    """group -> (role, replicas): one recorder app per replica, named group-<ordinal>."""
    journal: list[str] = []
    apps, parts, refs = {}, {}, []
    for group, (role, replicas) in counts.items():
        for ordinal in range(replicas):
            name = f"{group}-{ordinal}"
            apps[name], parts[name] = recorder_app(name, role, journal)
            refs.append(
                ParticipantRef(
                    name, role, f"http://{name}", replica=Replica(group=group, ordinal=ordinal, replicas=replicas)
                )
            )
    return apps, parts, refs, journal


STACK = {"collection": ("controller", 1), "model": ("model", 2), "agent": ("agent", 2), "resources": ("resources", 2)}


async def transact(apps, refs, fn):
    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        return await fn(Coordinator(refs, client))


def test_incomplete_replica_sets_are_named() -> None:
    def ref(name: str, ordinal: int, replicas: int) -> ParticipantRef:
        return ParticipantRef(
            name, "agent", f"http://{name}", replica=Replica(group="agent", ordinal=ordinal, replicas=replicas)
        )

    check_replica_sets([ref("agent-0", 0, 2), ref("agent-1", 1, 2)])
    with pytest.raises(TransactionError, match=r"agent: runs 3 replicas but ordinals \[2\] did not answer"):
        check_replica_sets([ref("agent-0", 0, 3), ref("agent-1", 1, 3)])
    with pytest.raises(TransactionError, match="disagree"):
        check_replica_sets([ref("agent-0", 0, 2), ref("agent-1", 1, 3)])
    with pytest.raises(TransactionError, match=r"ordinals \[0\] answer twice"):
        check_replica_sets([ref("agent-0", 0, 1), ref("agent-0b", 0, 1)])
    with pytest.raises(ValueError):
        Replica(group="agent", ordinal=2, replicas=2)


async def test_every_replica_is_prepared_and_captured_and_the_manifest_says_which_it_is(tmp_path) -> None:
    apps, parts, refs, journal = replicated(STACK)
    result = await transact(apps, refs, lambda c: c.checkpoint("ck-r", f"file://{tmp_path}", prepare_timeout_s=5))
    assert result.status == "completed", result.error
    assert sorted(p.participant_id for p in result.participants) == sorted(parts)
    assert {line.split()[1] for line in journal if line.startswith("capture")} == set(parts)
    manifest = json.loads(open_storage(f"file://{tmp_path}").get(layout.global_manifest_key("ck-r")))
    replicas = {p["participant_id"]: p["replica"] for p in manifest["participants"]}
    assert replicas["agent-1"] == {"group": "agent", "ordinal": 1, "replicas": 2}
    assert replicas["collection-0"] == {"group": "collection", "ordinal": 0, "replicas": 1}


async def test_a_checkpoint_without_one_replica_is_refused_before_anything_pauses(tmp_path) -> None:
    apps, _parts, refs, journal = replicated(STACK)
    present = [r for r in refs if r.participant_id != "resources-1"]
    result = await transact(apps, present, lambda c: c.checkpoint("ck-r", f"file://{tmp_path}"))
    assert result.status == "failed"
    assert "resources: runs 2 replicas but ordinals [1] did not answer" in result.error
    assert journal == []  # nobody was paused


async def test_restore_maps_replicas_by_ordinal_and_refuses_other_counts(tmp_path) -> None:
    location = f"file://{tmp_path}"
    apps, _parts, refs, _journal = replicated(STACK)
    assert (await transact(apps, refs, lambda c: c.checkpoint("ck-r", location))).status == "completed"

    smaller = replicated({**STACK, "agent": ("agent", 1)})
    result = await transact(smaller[0], smaller[2], lambda c: c.restore("ck-r", location))
    assert result.status == "failed"
    assert "agent: 2 in the checkpoint, 1 here" in result.error and "replicas: in the stack YAML" in result.error
    assert not any(line.startswith("install") for line in smaller[3])  # nothing restored anywhere

    larger = replicated({**STACK, "resources": ("resources", 3)})
    result = await transact(larger[0], larger[2], lambda c: c.restore("ck-r", location))
    assert result.status == "failed" and "resources: 2 in the checkpoint, 3 here" in result.error

    same = replicated(STACK)
    result = await transact(same[0], same[2], lambda c: c.restore("ck-r", location))
    assert result.status == "completed", result.error
    # each replica installed its own records: the controller's episode records went to collection-0 only
    assert same[1]["collection-0"].installed == ["episode-r1", "episode-r2"]
    assert all(same[1][name].installed == [] for name in same[1] if name != "collection-0")
    assert {line.split()[1] for line in same[3] if line.startswith("install")} == set(same[1])


async def test_prepares_and_captures_of_one_role_run_concurrently(tmp_path) -> None:
    """Every replica of a role is inside its prepare, and then inside its capture, at the same time."""
    apps, parts, refs, _ = replicated({"collection": ("controller", 1), "resources": ("resources", 8)})
    inside = {"prepare": 0, "export": 0}
    most = {"prepare": 0, "export": 0}
    everyone = {"prepare": asyncio.Event(), "export": asyncio.Event()}

    def concurrently(verb: str, call):
        async def wrapped(arg):
            inside[verb] += 1
            most[verb] = max(most[verb], inside[verb])
            if inside[verb] == 8:
                everyone[verb].set()
            # each waits (bounded) until all eight are in: only concurrent calls get there
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everyone[verb].wait(), 5)
            inside[verb] -= 1
            return await call(arg)

        return wrapped

    for name, part in parts.items():
        if name.startswith("resources"):
            part.prepare = concurrently("prepare", part.prepare)
            part.export = concurrently("export", part.export)
    result = await transact(apps, refs, lambda c: c.checkpoint("ck-c", f"file://{tmp_path}", prepare_timeout_s=20))
    assert result.status == "completed", result.error
    assert most == {"prepare": 8, "export": 8}
