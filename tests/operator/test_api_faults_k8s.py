"""The Kubernetes API misbehaving under the operator (an outage, refused status writes, a stalled watch): the
transaction does not need the API, so the stack ends open on time without waiting for a pause lease, and the resource
ends Completed or Failed once the API answers. Each test gets an emulator of its own (its faults are the
emulator's)."""

from __future__ import annotations

import time

import httpx
import pytest
from tests.operator.harness import (
    LONG_LEADER_TIMINGS,
    PauseMonitor,
    Stack,
    WithholdingProxy,
    admission_is_open,
    apply,
    checkpoint_doc,
    get,
    operator_live,
    report_pause,
    wait_for,
)

pytestmark = pytest.mark.k8s


def api_reachable(url: str) -> bool:
    """Whether the API server's port accepts a TCP connection (an emulated outage closes its listener)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return True
    except OSError:
        return False


def test_fault_api_server_unreachable_mid_transaction(operator_env, kemu, kubectl, tmp_path) -> None:
    """The API server stops answering (connections refused, watches dropped) for 8 s while a sync checkpoint persists:
    the transaction does not need it and finishes on time (the stack resumes while the API server is still down);
    the status is written once the API server is back, and the Checkpoint ends Completed."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-1"), verb="persist", forward_withheld=True)
    try:
        stack.create_pods(control_ports={"counter-1": proxy.port})
        # the outage (8 s) is shorter than the leader's renew deadline here: a leader cut off for longer stops,
        # as client-go's does (test_an_operator_that_loses_its_lease_stops_at_once), and the next one carries on
        start_operator(stack, **LONG_LEADER_TIMINGS)
        proxy.hold.set()
        with PauseMonitor(stack) as pause:
            apply(
                kubectl, checkpoint_doc("outage", prepareTimeoutSeconds=10, leaseSeconds=60, method="sync")
            )  # a persist under the pause
            wait_for(proxy.withheld.is_set, timeout=30, what="the persist to be under way")
            outage_started = time.monotonic()
            kemu.outage(8.0)
            time.sleep(0.5)
            proxy.hold.clear()
            wait_for(lambda: admission_is_open(stack), timeout=20, what="the stack to resume")
            resumed_after = time.monotonic() - outage_started
            # the outage is still on (the API server's port refuses connections), not "resumed within n seconds":
            # a busy machine may take longer to get here, and what matters is that nothing waited for the API
            api_down_at_resume = not api_reachable(kemu.url)
            wait_for(
                lambda: kubectl("get", "checkpoint", "outage", check=False).returncode == 0,
                timeout=30,
                what="the API server to be back",
            )
            kubectl(
                "wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/outage", "--timeout=60s", timeout=70
            )
        report_pause(
            "API server unreachable 8 s mid-persist", pause, resumed_after_outage_start_s=round(resumed_after, 3)
        )
        assert api_down_at_resume, (
            f"the stack resumed {resumed_after:.1f} s into the outage, once the API server was back"
        )
        status = get(kubectl, "checkpoint", "outage")["status"]
        assert status["reason"] == "Completed" and status["participantCount"] == 2
        assert "status write failed" in (tmp_path / "operator.log").read_text()
    finally:
        proxy.stop()
        stack.kill()


@pytest.mark.parametrize("code", [409, 429, 500])
def test_fault_status_writes_refused(operator_env, kemu, kubectl, tmp_path, code: int) -> None:
    """The API server answers 409, 429 or 500 to the operator's status writes (the first six of them): the writes
    are retried, a checkpoint blocked by a live session still aborts at its deadline (stack reopened, not at the
    60 s lease) and ends Failed with reason Blocked; the next one completes."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "restart_only", "counter-1": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})
            cookies = dict(http.cookies)
        kemu.inject(code, times=6, verb="patch", resource="checkpoints", subresource="status")
        with PauseMonitor(stack) as pause:
            apply(kubectl, checkpoint_doc("refused", prepareTimeoutSeconds=2, leaseSeconds=60))
            kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/refused", "--timeout=60s", timeout=70)
            wait_for(lambda: admission_is_open(stack), timeout=5, what="the stack to be open")
        report_pause(f"status writes answered {code} (blocked checkpoint)", pause)
        assert pause.longest() < 15  # the 2 s prepare deadline, not the 60 s lease
        assert get(kubectl, "checkpoint", "refused")["status"]["reason"] == "Blocked"
        assert kemu.faults()[0]["served"] == 6
        with httpx.Client(base_url=stack.url("counter-0"), cookies=cookies) as http:
            http.post("/verify", json={"target": 1}, headers={"x-ng-rollout-id": "live"})  # the episode ends
        kemu.inject(code, times=3, verb="patch", resource="checkpoints", subresource="status")
        with PauseMonitor(stack) as pause:
            apply(kubectl, checkpoint_doc("after", prepareTimeoutSeconds=10, leaseSeconds=60))
            kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/after", "--timeout=60s", timeout=70)
        report_pause(f"status writes answered {code} (completed checkpoint)", pause)
    finally:
        stack.kill()


def test_a_stalled_watch_is_dropped_and_reopened_by_the_operator(operator_env, kemu, kubectl, tmp_path) -> None:
    """Every Checkpoint watch open goes silent for 5 minutes (a half-open connection: kemu's stall); the liveness
    probe stays green throughout, so only the operator's own watch timeouts can notice. With
    GYMCKPT_WATCH_TIMEOUT_SECONDS=5 the stream is dropped after 15 s of silence and re-opened, and a Checkpoint
    created into the silence runs. On ce41d67 (no client or inactivity timeout of ours) the watch waited on kopf's
    70 s default, past this test's 60 s."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    operator = start_operator(stack, GYMCKPT_WATCH_TIMEOUT_SECONDS="5")
    try:
        apply(kubectl, checkpoint_doc("before", prepareTimeoutSeconds=10))
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/before", "--timeout=60s", timeout=70)
        kemu.stall_watches(300, resource="checkpoints")  # the operator's open watch of Checkpoints hears nothing more
        apply(kubectl, checkpoint_doc("into-the-silence", prepareTimeoutSeconds=10))
        assert operator_live(operator.health)  # liveness cannot tell
        kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Completed",
            "checkpoint/into-the-silence",
            "--timeout=60s",
            timeout=70,
        )
        assert operator_live(operator.health)
    finally:
        stack.kill()
