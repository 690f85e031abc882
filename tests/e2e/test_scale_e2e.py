"""Scale-out end to end (``gymckpt demo --replicas 2 --workers 2``): two replicas of every participant but
the collection and two inference workers, each a real uvicorn process; one worker SIGKILLed mid-generation,
then a checkpoint, every process SIGKILLed, a restore into fresh processes — rewards equal an uninterrupted
run's, no token is generated twice, every rollout's state lives on the replica its id hashes to, and a stack
with other replica counts is refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from gym_services.base.affinity import replica_for
from gym_services.control import layout
from gym_services.control.manifests import parse_participant_manifest
from gym_services.control.models import PackedManifest
from gym_services.control.storage import open_storage
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator
from gym_services.demo.report import compare
from gym_services.demo.stack import demo_stack
from gym_services.demo.story import Story
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def test_replicas_and_a_killed_worker_equal_an_uninterrupted_run(tmp_path) -> None:
    story = Story(
        tmp_path / "story",
        repeats=1,
        # 8 at a time, so that tasks still wait at the worker kill (20%) and at the checkpoint (50%): with 32 at a
        # time every task ran at once, and under two busy loops the run could be over before the kill found the
        # worker streaming ("streamed nothing for 30s")
        concurrency=8,
        tokens_per_second=60.0,
        checkpoint_at=0.5,
        replicas=2,
        workers=2,
        kill_worker_at=0.2,
        timeout_s=300,
        say=lambda text: None,
    )
    try:
        story.prepare()
        base = story.uninterrupted()
        ckpt = story.checkpointed()
    finally:
        story.close()
    verdict = compare(base, ckpt, story.agent_env)
    assert verdict.ok, verdict.problems  # rewards equal, 0 tokens regenerated, no episode ran twice

    # a worker died mid-generation; its generations went on elsewhere at once, no episode was run again for it
    # (a generation it was streaming may still have finished on it before the kill landed: that one needs no failover)
    assert ckpt.worker_killed["name"] == "inference-worker-1" and ckpt.worker_killed["streaming"] >= 1
    models = [live for pid, live in ckpt.in_flight.items() if pid.startswith("policy-model-")]
    failovers = sum(m["failovers"] for m in models)
    # (and a new one may have started on it between the last look and the kill: no upper bound from that look)
    assert len(models) == 2 and failovers >= 1, (failovers, ckpt.worker_killed)
    assert failovers == sum(m["upstream_failures"] for m in models)  # none waited for a backoff
    # tokens are counted where they arrive (the policy models), so the dead worker's count is what they received
    # from it before the kill: something, and part of the run's total, which the verdict found regenerated nowhere
    victim = ckpt.worker_killed["name"]
    assert 0 < ckpt.delivered[victim] <= ckpt.tokens_before_cut, (ckpt.delivered, ckpt.tokens_before_cut)
    assert ckpt.reruns_before_checkpoint == 0
    assert len(ckpt.results) == len(base.results) == len(story.tasks) and not ckpt.duplicates

    # every replica is its own participant, checkpointed and restored
    checkpoint, restore = ckpt.checkpoint, ckpt.restore
    assert checkpoint is not None and restore is not None
    ids = {p.participant_id for p in checkpoint.participants}
    assert {
        "policy-model-0",
        "policy-model-1",
        "agent-blackjack-0",
        "agent-blackjack-1",
        "blackjack-0",
        "blackjack-1",
        "workplace-assistant-0",
        "workplace-assistant-1",
        "collection",
    } <= ids
    assert {p.participant_id for p in restore.participants} == ids

    # rollout affinity: every record of a rollout is on the replica its id hashes to
    storage = open_storage(story.storage)
    manifest = json.loads(storage.get(layout.global_manifest_key(checkpoint.checkpoint_id)))
    placed = 0
    for entry in manifest["participants"]:
        replica = entry["replica"]
        parsed = parse_participant_manifest(storage.get(entry["manifest_key"]))  # packed or plain (version 1)
        rollouts = (
            list(parsed.records.rollout_ids)
            if isinstance(parsed, PackedManifest)
            else [r.rollout_id for r in parsed.records]
        )
        for rollout_id in rollouts:
            if rollout_id and replica["replicas"] > 1:
                assert replica_for(rollout_id, replica["replicas"]) == replica["ordinal"], (entry, rollout_id)
                placed += 1
    assert placed > 0

    # a stack with one replica of each cannot take this checkpoint: refused, naming the counts
    other = demo_stack(tmp_path / "other", replicas=1, workers=1)
    state = start_stack(other, tmp_path, ready_timeout_s=120)
    try:
        token = stack_secrets(tmp_path / "other")["control_token"]

        async def restore_here():
            async with ControlClient(token) as client:
                coordinator = Coordinator(await discover(state, client), client)
                return await coordinator.restore(checkpoint.checkpoint_id, story.storage)

        refused = asyncio.run(restore_here())
    finally:
        stop_stack(tmp_path / "other")
    assert refused.status == "failed"
    assert "other replica counts" in refused.error and "agent-workplace: 2 in the checkpoint, 1 here" in refused.error
