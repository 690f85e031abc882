"""The operator's status writes against the strict emulator: best-effort and retried (409, 429, 5xx, an API
server that does not answer), never blocking the caller; 404 ends them; ``observedGeneration`` on every write;
a condition's ``lastTransitionTime`` moves only when its status changes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tests.operator.harness import install_crds

from gym_operator.kube import Kube
from gym_operator.status import failed_status, progress_status
from gym_operator.writer import StatusWriter
from gym_services.coordination.transaction import TransactionPhase

pytestmark = pytest.mark.k8s


@pytest.fixture
def checkpoint(kemu, kubectl, monkeypatch):
    """One Checkpoint in the test's namespace (no operator runs) and a Kube client as the admin; returns
    (kube, fetch)."""
    install_crds(kemu, kubectl)
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Checkpoint",
                "metadata": {"name": "w"},
                "spec": {"release": "w"},
            }
        ),
    )
    monkeypatch.setenv("KUBECONFIG", str(kemu.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def fetch() -> dict:
        return json.loads(kubectl("get", "checkpoint", "w", "-o", "json").stdout)

    return Kube.connect(), fetch


def writer_for(kube: Kube, fetch) -> StatusWriter:
    obj = fetch()
    meta = obj["metadata"]
    return StatusWriter(kube, "checkpoints", meta["namespace"], "w", meta["generation"], obj.get("status"))


async def test_writes_carry_observed_generation_and_keep_transition_times(checkpoint) -> None:
    kube, fetch = checkpoint
    writer = writer_for(kube, fetch)
    writer.write(progress_status(TransactionPhase.PREPARING, "preparing", 1))
    assert await writer.flush(10)
    first = fetch()["status"]
    assert first["observedGeneration"] == 1 and first["phase"] == "Preparing" and first["reason"] == "Preparing"
    await asyncio.sleep(1.1)  # timestamps have one-second resolution
    writer.write(progress_status(TransactionPhase.CAPTURING, "capturing", 1))
    assert await writer.flush(10)
    second = fetch()["status"]
    assert second["phase"] == "Capturing"
    assert second["conditions"][0]["lastTransitionTime"] == first["conditions"][0]["lastTransitionTime"]  # still True
    await asyncio.sleep(1.1)
    writer.write(failed_status("Blocked", "blocked", 1))
    assert await writer.flush(10)
    third = {c["type"]: c for c in fetch()["status"]["conditions"]}
    assert third["Progressing"]["status"] == "False"
    assert third["Progressing"]["lastTransitionTime"] > first["conditions"][0]["lastTransitionTime"]  # it changed
    await writer.close()


@pytest.mark.parametrize("code", [409, 429, 500, 503])
async def test_refused_writes_are_retried_until_they_are_in(checkpoint, kemu, code: int) -> None:
    kube, fetch = checkpoint
    kemu.inject(code, times=3, verb="patch", resource="checkpoints", subresource="status")
    writer = writer_for(kube, fetch)
    started = time.monotonic()
    writer.write(progress_status(TransactionPhase.PREPARING, "preparing", 1))
    assert time.monotonic() - started < 0.1  # the caller never waits for the API server
    writer.write(progress_status(TransactionPhase.CAPTURING, "capturing", 1))  # folds into the pending write
    assert await writer.flush(30)
    assert fetch()["status"]["phase"] == "Capturing" and writer.failures == 3
    assert kemu.faults()[0]["served"] == 3
    await writer.close()


async def test_writes_survive_an_api_server_outage(checkpoint, kemu) -> None:
    kube, fetch = checkpoint
    writer = writer_for(kube, fetch)
    kemu.outage(2.0)
    await asyncio.sleep(0.3)
    writer.write(progress_status(TransactionPhase.PREPARING, "preparing", 1))
    assert not await writer.flush(1.0)  # not in yet: nobody answers
    assert await writer.flush(30)
    assert fetch()["status"]["phase"] == "Preparing" and writer.failures >= 1
    await writer.close()


async def test_a_deleted_resource_ends_the_writing(checkpoint, kubectl) -> None:
    kube, fetch = checkpoint
    writer = writer_for(kube, fetch)
    kubectl("delete", "checkpoint", "w")
    writer.write(progress_status(TransactionPhase.PREPARING, "preparing", 1))
    assert not await writer.flush(10) and writer.gone
    writer.write(progress_status(TransactionPhase.CAPTURING, "capturing", 1))  # ignored, returns at once
    assert await writer.flush(1) is False
    await writer.close()


async def test_conditional_writes_go_on_over_a_live_body_that_lags(checkpoint, kubectl) -> None:
    """Writes conditional on the resourceVersion of kopf's live body, which stops moving while kopf runs the
    resource's deletion handler (it waits for the transaction, which waits for its last status write): the writer
    follows its own writes' versions, and after a 409 (someone else changed the object: a label, a deletion) reads the
    version again, so the last status gets in instead of a 409 for ever. A write over an older version than what is
    there is still refused: the fence of a leader whose write was on its way when another wrote."""
    kube, fetch = checkpoint
    meta = fetch()["metadata"]
    frozen = meta["resourceVersion"]
    fences: list[int] = []
    writer = StatusWriter(
        kube, "checkpoints", meta["namespace"], "w", meta["generation"], None,
        fence=lambda: fences.append(1), version=lambda: frozen,
    )  # fmt: skip
    writer.write(progress_status(TransactionPhase.PREPARING, "preparing", 1))
    assert await writer.flush(10)
    writer.write(progress_status(TransactionPhase.CAPTURING, "capturing", 1))  # over its own write's version
    assert await writer.flush(10) and writer.failures == 0
    kubectl("label", "checkpoint", "w", "someone=else")  # a newer version the live body never shows
    writer.write(failed_status("Aborted", "aborted", None))
    assert await writer.flush(20)
    assert fetch()["status"]["phase"] == "Failed" and writer.failures == 1 and len(fences) == 4  # fenced every try
    with pytest.raises(Exception, match="409"):
        await kube.patch_status("checkpoints", meta["namespace"], "w", {"message": "late"}, frozen)
    await writer.close()
