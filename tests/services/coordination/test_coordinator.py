"""The coordinator against in-process participants: order, blockers, failures, idempotency."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest
from tests.services.coordination.recorders import fresh_stack, phase_of, run
from tests.support.asgi import TOKEN, serve_many

from gym_services.control import layout
from gym_services.control.models import CheckpointRef
from gym_services.control.retention import Retention
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.checkpoint import CheckpointTransaction
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, TransactionError, list_checkpoints


@pytest.mark.parametrize("method", ["background", "sync"])
async def test_checkpoint_order_scope_and_manifest(stack, storage_url, method) -> None:
    _, parts, _, journal = stack

    async def go(coordinator, transport, events):
        async with httpx.AsyncClient(transport=transport) as http:
            await http.post("http://counter/seed_session", json={"start": 4}, headers={"x-ng-rollout-id": "r1"})
        result = await coordinator.checkpoint("ck-1", storage_url, prepare_timeout_s=5, method=method)
        return result, events

    result, events = await run(stack, go)

    assert result.status == "completed", result.error
    prepared = phase_of(journal, "prepare")
    assert prepared.index("controller") < prepared.index("env-a") < prepared.index("model-a")
    assert prepared.index("model-a") < min(prepared.index("agent-a"), prepared.index("agent-b"))
    assert max(prepared.index("agent-a"), prepared.index("agent-b")) < prepared.index("resources-a")
    resumed = phase_of(journal, "resume")
    # the servers agents call reopen first, the agents next, the controller last
    assert max(resumed.index(p) for p in ("resources-a", "model-a", "env-a")) < resumed.index("agent-a")
    assert resumed[-1] == "controller"
    # the controller captures first; its live episodes scope everyone else
    captures = [line for line in journal if line.startswith("capture")]
    assert captures[0] == "capture controller scope=None"
    assert all(line.endswith("scope=['r1', 'r2']") for line in captures[1:])
    store = open_storage(storage_url)
    manifest = json.loads(store.get(layout.global_manifest_key("ck-1")))
    assert {p["participant_id"] for p in manifest["participants"]} == set(parts) | {"counter"}
    assert manifest["episodes"] == ["r1", "r2"] and manifest["method"] == method
    if method == "sync":  # one path: captured, written, verified and published, then resumed
        assert events == ["Preparing", "Capturing", "Persisting", "Publishing", "Resuming", "Completed"]
        assert set(result.timings) >= {"prepare", "capture", "persist", "verify", "publish", "resume"}
        assert result.published_s < result.pause_s
    else:  # captured under the pause, resumed, written in the background, then published
        assert events == ["Preparing", "Capturing", "Resuming", "Persisting", "Publishing", "Completed"]
        assert set(result.timings) >= {"prepare", "capture", "resume", "persist", "verify", "publish"}
        assert result.published_s > result.pause_s
    assert result.records == 3 and result.pause_s > 0 and result.method == method
    assert 0 <= result.timings["prepare agent waited"] <= result.timings["prepare agent"]
    assert [cid for cid, m in list_checkpoints(storage_url) if m] == ["ck-1"]


async def test_blockers_abort_everything(stack, tmp_path) -> None:
    _, parts, _, journal = stack
    parts["agent-b"].block = True

    async def go(coordinator, transport, events):
        result = await coordinator.checkpoint("ck-1", f"file://{tmp_path}", prepare_timeout_s=0.3)
        statuses = await coordinator.status()
        return result, statuses, events

    result, statuses, events = await run(stack, go)
    assert result.status == "failed" and "blockers" in result.error
    assert [b.model_dump() for b in result.blockers] == [
        {"participant": "agent-b", "kind": "episode", "id": "r9", "detail": "tool call running", "server": None}
    ]
    assert "prepare resources-a" not in journal  # never reached
    assert {line.split()[1] for line in journal if line.startswith("abort")} == {
        "controller",
        "env-a",
        "model-a",
        "agent-a",
        "agent-b",
    }
    assert all(s.phase in ("open", "fresh") and s.admission_open for s in statuses.values())
    assert not (tmp_path / layout.global_manifest_key("ck-1")).exists()
    assert events[-1] == "Failed"


async def test_capture_failure_publishes_nothing(stack, storage_url) -> None:
    _, parts, _, _journal = stack
    parts["model-a"].fail_export = True

    async def go(coordinator, transport, events):
        result = await coordinator.checkpoint("ck-1", storage_url)
        return result, await coordinator.status()

    result, statuses = await run(stack, go)
    assert result.status == "failed" and "disk on fire" in result.error
    assert not open_storage(storage_url).exists(layout.global_manifest_key("ck-1"))
    assert all(s.admission_open for s in statuses.values())
    # the capture failed under the pause: nothing written but the claim and the failure
    assert list_checkpoints(storage_url) == [("ck-1", None)]
    assert json.loads(open_storage(storage_url).get(layout.tombstone_key("ck-1")))["reason"] == "failed"


async def test_restore_failure_installs_nothing_anywhere(stack, tmp_path) -> None:
    _apps, _parts, refs, _journal = stack
    loc = f"file://{tmp_path}"

    async def take(coordinator, transport, events):
        return await coordinator.checkpoint("ck-1", loc)

    assert (await run(stack, take)).status == "completed"
    # fresh processes: a new stack of apps, one of which refuses its records
    fresh_journal: list[str] = []
    fresh_apps, fresh_parts = fresh_stack(refs, fresh_journal)
    fresh_parts["agent-b"].fail_validate = True

    async def restore(coordinator, transport, events):
        result = await coordinator.restore("ck-1", loc)
        return result, await coordinator.status()

    result, statuses = await run((fresh_apps, fresh_parts, refs, fresh_journal), restore)
    assert result.status == "failed" and "bad record" in result.error
    assert all(not p.installed for p in fresh_parts.values())
    assert all(s.phase == "fresh" and s.live in ({}, {"sessions": 0}) for s in statuses.values())


async def test_restore_moves_episodes_to_next_attempt(stack, tmp_path) -> None:
    _apps, _parts, refs, _journal = stack
    loc = f"file://{tmp_path}"
    assert (await run(stack, lambda c, t, e: c.checkpoint("ck-1", loc))).status == "completed"
    fresh, fresh_parts = fresh_stack(refs, [])
    result = await run((fresh, fresh_parts, refs, []), lambda c, t, e: c.restore("ck-1", loc))
    assert result.status == "completed", result.error
    assert result.episodes == {"r1": 1, "r2": 1}
    assert fresh_parts["controller"].installed == ["episode-r1", "episode-r2"]


async def test_repeating_a_finished_restore_installs_nothing_twice(stack, tmp_path) -> None:
    """A coordinator re-run with the same restore id (an operator restarted after the restore
    finished) gets the same answers; a new restore id restores again."""
    _apps, _parts, refs, _journal = stack
    loc = f"file://{tmp_path}"
    assert (await run(stack, lambda c, t, e: c.checkpoint("ck-1", loc))).status == "completed"
    fresh_journal: list[str] = []
    fresh, fresh_parts = fresh_stack(refs, fresh_journal)

    async def twice(coordinator, transport, events):
        first = await coordinator.restore("ck-1", loc, restore_id="rs-a")
        installs = len(phase_of(fresh_journal, "install"))
        again = await coordinator.restore("ck-1", loc, restore_id="rs-a")
        repeated_installs = len(phase_of(fresh_journal, "install")) - installs
        other = await coordinator.restore("ck-1", loc, restore_id="rs-b")
        return first, again, repeated_installs, other, installs

    first, again, repeated_installs, other, installs = await run((fresh, fresh_parts, refs, fresh_journal), twice)
    assert first.status == again.status == other.status == "completed", (first.error, again.error, other.error)
    assert installs == 6 and repeated_installs == 0
    assert again.episodes == first.episodes == {"r1": 1, "r2": 1} and again.restore_id == "rs-a"
    assert len(phase_of(fresh_journal, "install")) == 12  # a new restore id is a new restore
    assert CheckpointStore(open_storage(loc)).decision("ck-1", "rs-a") == "resume"


async def test_unknown_or_incomplete_checkpoint_is_refused(stack, tmp_path) -> None:
    loc = f"file://{tmp_path}"
    result = await run(stack, lambda c, t, e: c.restore("nope", loc))
    assert result.status == "failed" and "unknown or incomplete" in result.error
    store = open_storage(loc)
    store.put(layout.global_manifest_key("bad"), b"{not json")
    result = await run(stack, lambda c, t, e: c.restore("bad", loc))
    assert result.status == "failed" and "not JSON" in result.error


async def test_retrying_a_published_checkpoint_is_idempotent(stack, tmp_path) -> None:
    loc = f"file://{tmp_path}"
    _, _, _, journal = stack

    async def twice(coordinator, transport, events):
        first = await coordinator.checkpoint("ck-1", loc, transaction_id="tx-1")
        prepared = len(phase_of(journal, "prepare"))
        second = await coordinator.checkpoint("ck-1", loc, transaction_id="tx-1")
        return first, second, prepared

    first, second, prepared = await run(stack, twice)
    assert first.status == second.status == "completed"
    assert second.records == first.records and second.bytes == first.bytes
    assert first.transaction_id == second.transaction_id == "tx-1"
    assert "already published" in second.warnings[0]
    assert len(phase_of(journal, "prepare")) == prepared  # the repeat paused nothing


async def _all_open(coordinator) -> bool:
    return all(s.admission_open and s.checkpoint_id is None for s in (await coordinator.status()).values())


async def test_another_transaction_under_a_published_id_is_refused_and_pauses_nothing(stack, storage_url) -> None:
    """An id already published by another stack (or an earlier run) is refused, not "completed"."""
    _, _, _, journal = stack
    store = open_storage(storage_url)

    async def go(coordinator, transport, events):
        first = await coordinator.checkpoint("ck-1", storage_url)
        manifest = store.get(layout.global_manifest_key("ck-1"))
        journal.clear()
        events.clear()
        second = await coordinator.checkpoint("ck-1", storage_url)  # a new transaction: no transaction_id given
        return first, second, manifest, events, await _all_open(coordinator)

    first, second, manifest, events, open_ = await run(stack, go)
    assert first.status == "completed" and first.transaction_id
    assert second.status == "failed" and second.phase == "Pending"
    assert "checkpoint ck-1 already exists" in second.error and "choose another checkpoint id" in second.error
    assert first.transaction_id in second.error
    assert journal == [] and events == ["Failed"]  # no participant was asked anything
    assert open_
    assert store.get(layout.global_manifest_key("ck-1")) == manifest  # nothing written


async def test_an_id_claimed_by_another_running_transaction_is_refused(stack, storage_url) -> None:
    """The claim is written before anything is paused: a second transaction under the same id never prepares."""
    _, _, _, journal = stack
    open_storage(storage_url).put_if_absent(
        layout.claim_key("ck-1"),
        json.dumps(
            {
                "schema_version": 1,
                "checkpoint_id": "ck-1",
                "transaction_id": "other",
                "claimed_by": "elsewhere",
                "created_at": 0.0,
            }
        ).encode(),
    )

    async def go(coordinator, transport, events):
        return await coordinator.checkpoint("ck-1", storage_url, transaction_id="mine"), await _all_open(coordinator)

    result, open_ = await run(stack, go)
    assert result.status == "failed" and "already names another transaction (other, by elsewhere" in result.error
    assert "not published" in result.error and journal == [] and open_


async def test_the_same_transaction_carries_on_after_an_interruption(stack, tmp_path) -> None:
    """An operator restarted mid-checkpoint runs the same transaction (its uid) again: the claim is its own."""
    loc = f"file://{tmp_path}"
    _, parts, _, _ = stack

    async def go(coordinator, transport, events):
        parts["agent-a"].block = True
        run = asyncio.create_task(coordinator.checkpoint("ck-1", loc, prepare_timeout_s=30, transaction_id="uid-1"))
        for _ in range(500):  # until it has claimed the id and waits on agent-a's boundary
            if "Preparing" in events:
                break
            await asyncio.sleep(0.01)
        run.cancel()  # the operator running it stops: nothing is aborted or recorded, leases reopen the servers
        with contextlib.suppress(asyncio.CancelledError):
            await run
        for status in (await coordinator.status()).values():
            if status.checkpoint_id == "ck-1":  # as each server's lease would
                await coordinator.client.abort(
                    next(r for r in coordinator.participants if r.participant_id == status.participant_id),
                    CheckpointRef(checkpoint_id="ck-1"),
                )
        parts["agent-a"].block = False
        other = await coordinator.checkpoint("ck-1", loc, transaction_id="uid-2")
        again = await coordinator.checkpoint("ck-1", loc, transaction_id="uid-1")
        return other, again

    other, again = await run(stack, go)
    assert other.status == "failed" and "already names another transaction (uid-1" in other.error
    assert again.status == "completed" and again.transaction_id == "uid-1"
    manifest = json.loads(open_storage(loc).get(layout.global_manifest_key("ck-1")))
    assert manifest["transaction_id"] == "uid-1"


async def test_a_checkpoint_published_before_claims_existed_is_refused(stack, tmp_path) -> None:
    loc = f"file://{tmp_path}"

    async def go(coordinator, transport, events):
        await coordinator.checkpoint("ck-1", loc)
        store = open_storage(loc)
        manifest = json.loads(store.get(layout.global_manifest_key("ck-1")))
        del manifest["transaction_id"]
        store.put(layout.global_manifest_key("ck-1"), json.dumps(manifest).encode())
        store.delete(layout.claim_key("ck-1"))
        return await coordinator.checkpoint("ck-1", loc, transaction_id="late")

    result = await run(stack, go)
    assert result.status == "failed" and "checkpoint ck-1 already exists" in result.error


async def test_two_transactions_racing_for_one_id_one_wins(stack, storage_url) -> None:
    import asyncio

    async def go(coordinator, transport, events):
        return await asyncio.gather(
            coordinator.checkpoint("ck-1", storage_url, transaction_id="a"),
            coordinator.checkpoint("ck-1", storage_url, transaction_id="b"),
        )

    results = await run(stack, go)
    assert sorted(r.status for r in results) == ["completed", "failed"]
    loser = next(r for r in results if r.status == "failed")
    assert "already names another transaction" in loser.error and loser.phase == "Pending"


async def test_unreachable_participant_fails_cleanly(stack, tmp_path) -> None:
    apps, parts, refs, journal = stack
    refs = [*refs, ParticipantRef("ghost", "agent", "http://ghost")]
    result = await run((apps, parts, refs, journal), lambda c, t, e: c.checkpoint("ck-1", f"file://{tmp_path}"))
    assert result.status == "failed" and "unreachable" in result.error
    assert "abort agent-a" in journal


async def test_retire_order(stack) -> None:
    _, _, _, journal = stack
    dropped = await run(stack, lambda c, t, e: c.retire("r1", 0))
    order = [line.split()[1] for line in journal if line.startswith("retire")]
    assert order.index("env-a") < order.index("agent-a") < order.index("model-a")
    assert order[-1] == "controller" and dropped["env-a"] is True


async def test_a_failing_event_sink_changes_nothing(stack, tmp_path) -> None:
    """The operator's sink writes status to the Kubernetes API; when that fails, abort and resume still run."""
    apps, parts, refs, journal = stack
    parts["agent-b"].block = True
    calls: list[str] = []

    async def broken(phase, detail):
        calls.append(phase)
        raise RuntimeError("404 Not Found: the Checkpoint was deleted")

    async with serve_many(apps) as transport:
        client = ControlClient(TOKEN, transport=transport)
        try:
            coordinator = Coordinator(refs, client, on_event=broken)
            failed = await coordinator.checkpoint("ck-1", f"file://{tmp_path}", prepare_timeout_s=0.3)
            statuses = await coordinator.status()
            parts["agent-b"].block = False
            completed = await coordinator.checkpoint("ck-2", f"file://{tmp_path}", prepare_timeout_s=5)
        finally:
            await client.aclose()
    assert failed.status == "failed" and "blockers" in failed.error
    assert {line.split()[1] for line in journal if line.startswith("abort")} >= {"controller", "agent-b"}
    assert all(s.admission_open for s in statuses.values())
    assert completed.status == "completed" and "Aborting" in calls and calls[-1] == "Completed"


async def test_cancelling_a_checkpoint_mid_prepare_aborts_at_once(stack, tmp_path) -> None:
    """A cancelled checkpoint (its Checkpoint resource deleted) stops waiting for boundaries and aborts every
    participant touched, long before its prepare deadline or lease."""
    import asyncio
    import time

    _, parts, _, journal = stack
    parts["agent-b"].block = True

    async def go(coordinator, transport, events):
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, cancel.set)
        started = time.monotonic()
        result = await coordinator.checkpoint(
            "ck-1", f"file://{tmp_path}", prepare_timeout_s=30, lease_s=60, cancel=cancel
        )
        return result, time.monotonic() - started, await coordinator.status(), events

    result, took, statuses, events = await run(stack, go)
    assert result.status == "failed" and result.error.startswith("cancelled")
    assert took < 5, took  # not the 30 s prepare deadline
    assert {line.split()[1] for line in journal if line.startswith("abort")} >= {"controller", "agent-b"}
    assert all(s.admission_open and s.checkpoint_id is None for s in statuses.values())
    assert events[-2:] == ["Aborting", "Failed"]
    assert not (tmp_path / layout.global_manifest_key("ck-1")).exists()


async def test_a_published_checkpoint_is_not_cancelled(stack, tmp_path) -> None:
    """Cancel arriving once the manifest is published: the checkpoint completes and everyone resumes."""
    import asyncio

    async def go(coordinator, transport, events):
        cancel = asyncio.Event()

        async def sink(phase, detail):
            events.append(phase)
            if phase == "Resuming":
                cancel.set()

        coordinator.on_event = sink
        return await coordinator.checkpoint(
            "ck-1", f"file://{tmp_path}", prepare_timeout_s=5, cancel=cancel, method="sync"
        )

    result = await run(stack, go)
    assert result.status == "completed"
    assert (tmp_path / layout.global_manifest_key("ck-1")).exists()


async def test_cancelling_a_restore_before_its_decision_undoes_it_everywhere(stack, tmp_path) -> None:
    import asyncio

    _apps, _parts, refs, journal = stack
    loc = f"file://{tmp_path}"

    async def checkpoint(coordinator, transport, events):
        return await coordinator.checkpoint("ck-1", loc, prepare_timeout_s=5)

    assert (await run(stack, checkpoint)).status == "completed"
    fresh_apps, fresh_parts = fresh_stack(refs, journal)
    journal.clear()

    async def restore(coordinator, transport, events):
        cancel = asyncio.Event()

        async def sink(phase, detail):
            events.append(phase)
            if phase == "Restoring":
                cancel.set()  # the restore calls run; the decision is not written

        coordinator.on_event = sink
        return await coordinator.restore(
            "ck-1", loc, restore_id="rs-cancelled", cancel=cancel
        ), await coordinator.status()

    result, statuses = await run((fresh_apps, fresh_parts, refs, journal), restore)
    assert result.status == "failed" and result.error.startswith("cancelled")
    assert all(not p.installed for p in fresh_parts.values())
    assert all(s.admission_open for s in statuses.values())
    assert CheckpointStore(open_storage(loc)).decision("ck-1", "rs-cancelled") is None


async def test_deleting_a_checkpoint_removes_every_object_manifest_first(stack, storage_url) -> None:
    """`gymckpt checkpoints delete` and a Checkpoint deleted with deletionPolicy Delete share this code."""

    async def go(coordinator, transport, events):
        first = await coordinator.checkpoint("ck-1", storage_url, prepare_timeout_s=5)
        second = await coordinator.checkpoint("ck-2", storage_url, prepare_timeout_s=5)
        return first, second

    first, second = await run(stack, go)
    assert first.status == second.status == "completed"
    retention = Retention(CheckpointStore(open_storage(storage_url)))
    keys = retention.objects("ck-1")
    assert keys[0] == layout.global_manifest_key("ck-1")
    assert all(k.startswith("checkpoints/ck-1/") for k in keys)
    ck2_before = len(retention.objects("ck-2"))
    kept = retention.kept_for_others("ck-1")
    deleted = retention.delete("ck-1")
    assert deleted.published and deleted.objects <= len(keys)
    # what ck-2 (incremental) still reads of ck-1 stays, and the claim and tombstone keep the id taken; nothing else
    markers = {layout.claim_key("ck-1"), layout.tombstone_key("ck-1")}
    assert set(retention.objects("ck-1")) == set(kept) | markers and [
        c for c, m in list_checkpoints(storage_url) if m
    ] == ["ck-2"]
    assert retention.delete("ck-1").objects == 0  # again: nothing, not an error
    assert len(retention.objects("ck-2")) == ck2_before  # the other checkpoint is untouched


@pytest.mark.parametrize("method", ["background", "sync"])
async def test_a_failed_checkpoint_is_recorded_so_delete_and_prune_reclaim_it_at_once(
    stack, storage_url, method
) -> None:
    """A transaction its coordinator knows has failed is not in flight for 6 hours: its tombstone says failed, so
    `checkpoints delete` and `checkpoints prune` remove what it wrote now, and the id is never published."""
    _, _parts, _, _ = stack

    class FailingPersist(CheckpointTransaction):
        async def persist_all(self, captured):  # every participant wrote its packs and manifest; then it fails
            await super().persist_all(captured)
            raise TransactionError("verification went wrong")

    async def go(coordinator, transport, events):
        async with httpx.AsyncClient(transport=transport) as http:
            await http.post("http://counter/seed_session", json={"start": 4}, headers={"x-ng-rollout-id": "r1"})
        coordinator.checkpoint_transaction = FailingPersist
        first = await coordinator.checkpoint("ck-f", storage_url, prepare_timeout_s=5, method=method)
        second = await coordinator.checkpoint("ck-g", storage_url, prepare_timeout_s=5, method=method)
        coordinator.checkpoint_transaction = CheckpointTransaction
        again = await coordinator.checkpoint(
            "ck-f", storage_url, prepare_timeout_s=5, method=method, transaction_id=first.transaction_id
        )
        return first, second, again, await coordinator.status()

    first, second, again, statuses = await run(stack, go)
    assert first.status == second.status == "failed" and "verification went wrong" in first.error
    assert again.status == "failed" and "was deleted, failed or abandoned" in again.error  # never published
    assert all(s.admission_open for s in statuses.values())
    retention = Retention(CheckpointStore(open_storage(storage_url)))
    written = retention.objects("ck-f")
    assert any("/packs/" in k for k in written) and any(
        k.endswith("/participants/counter/manifest.json") for k in written
    )
    state = retention.store.state("ck-f")
    assert state.tombstone is not None and state.tombstone.reason == "failed" and not state.in_flight()
    deleted = retention.delete("ck-f")  # at once: not "being written" until its claim expires
    assert not deleted.published and deleted.objects == len(written) and retention.objects("ck-f") == []
    assert [d.checkpoint_id for d in retention.prune()] == ["ck-g"] and retention.objects("ck-g") == []
