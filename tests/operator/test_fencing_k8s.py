"""Fencing (gym_operator.leadership): a leader frozen past its Kubernetes Lease (SIGSTOP: a paused VM, a throttled
container) sends nothing after it wakes - no control call, no status write - while the standby that took over has
finished what it left. Its own emulator? No: the tests keep to their namespace, so the file shares one."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    RELEASE,
    Stack,
    WithholdingProxy,
    admission_is_open,
    apply,
    chart_operator_identity,
    checkpoint_doc,
    get,
    leads,
    phase,
    reasons_of,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_a_leader_frozen_past_its_lease_sends_nothing_after_it_wakes(
    operator_env, kemu, kubectl, namespace, tmp_path
) -> None:
    """Leader A (the chart's ServiceAccount) prepares a Checkpoint; its capture call is answered 503 while A is
    frozen (SIGSTOP) past its Kubernetes Lease. Standby B takes the Lease (a new term), carries on the same
    transaction and completes it. A is woken (SIGCONT): its coordinator would now abort and write Failed over B's
    Completed; instead A checks its leadership before each call and write, finds its last renewal too old on its own
    clock, and exits (status 3) - no control call reaches the server and no status write reaches the API server
    after it wakes. Every call named its leader's term, B's newer than A's."""
    start_operator, _ = operator_env
    kubeconfig, settings, _role = chart_operator_identity(kemu, kubectl, namespace, tmp_path)
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-0"), verb="capture")
    try:
        stack.create_pods(control_ports={"counter-0": proxy.port})
        a = start_operator(stack, kubeconfig, log_name="a.log", **settings)
        b = start_operator(stack, log_name="b.log", standby="yes", **settings)
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "r0"})
        proxy.hold.set()
        apply(kubectl, checkpoint_doc("frozen", prepareTimeoutSeconds=10, leaseSeconds=120))
        wait_for(proxy.withheld.is_set, timeout=60, what="A's capture to be on its way")
        os.kill(a.pid, signal.SIGSTOP)  # frozen: no renewal, no thread runs
        proxy.hold.clear()  # A's capture is answered 503 while A cannot read it
        wait_for(lambda: leads(b.health), timeout=60, what="B to take the Lease")
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/frozen", "--timeout=90s", timeout=100)
        wait_for(lambda: admission_is_open(stack), timeout=30, what="every server open")
        time.sleep(1.0)  # B is done: nothing of it is on its way either
        woke, woke_wall = time.monotonic(), time.time()
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=30) == 3  # it stopped acting, as losing the Lease does
        time.sleep(1.0)
    finally:
        proxy.stop()
        stack.kill()
    late = [call for call in proxy.calls if call[0] >= woke]
    assert not late, f"control calls after A woke: {late}"
    account = f"system:serviceaccount:{namespace}:{RELEASE}-gym-checkpoint-operator"
    writes = [e for e in kemu.audit(user=account) if e["time"] >= woke_wall and e["verb"] in ("patch", "update")]
    assert not [e for e in writes if e["subresource"] == "status"], writes
    assert phase(kubectl, "checkpoint", "frozen") == "Completed"
    assert get(kubectl, "checkpoint", "frozen")["status"]["reason"] == "Completed"
    assert "TakenOver" in reasons_of(kubectl, "frozen")
    terms = [term for _, _, term in proxy.calls]
    assert all(terms), proxy.calls  # every call named its term
    a_term, b_term = int(terms[0].rsplit("/", 1)[1]), int(terms[-1].rsplit("/", 1)[1])
    assert b_term > a_term, terms
    assert (
        "nothing more is sent in its name" in (tmp_path / "a.log").read_text()
        or "lost Lease" in (tmp_path / "a.log").read_text()
    )
