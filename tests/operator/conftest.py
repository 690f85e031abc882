"""Fixtures of the operator's tests on the Kubernetes API emulator (kemu, in tests/k8s).

Every test gets a namespace of its own (``namespace``), and ``kubectl`` defaults to it. A test file whose tests
leave the emulator as they found it but for their namespace (no outage, injected fault, stalled watch, audit or
deleted CRD) shares one emulator for the whole file: it overrides ``kemu`` with ``kemu_shared``. The others get a
fresh emulator per test. Each test starts its own operator (``operator_env``): tests give it settings of their own,
kill it and start another, so no operator outlives its test.
"""

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_K8S = str(Path(__file__).resolve().parents[1] / "k8s")
if _K8S not in sys.path:
    sys.path.insert(0, _K8S)

from kemu import fixtures as kemu_fixtures  # noqa: E402
from kemu.process import ADMIN_TOKEN, KemuEndpoint  # noqa: E402
from tests.operator.harness import (  # noqa: E402
    LEADER_TIMINGS,
    RELEASE,
    Operators,
    Stack,
    install_crds,
    leads,
    operator_live,
    stop_processes,
    wait_for,
)
from tests.support.ports import free_port  # noqa: E402

#: a fresh emulator per test, or (a test file overriding ``kemu`` with it) one for the whole file
kemu = kemu_fixtures.kemu
kemu_shared = kemu_fixtures.kemu_shared
Kubectl = kemu_fixtures.Kubectl

_namespaces = itertools.count()


@pytest.fixture
def namespace(kemu: KemuEndpoint) -> str:
    """A namespace of this test's own, created in the emulator."""
    name = f"t{os.getpid()}-{next(_namespaces)}"
    with kemu.client() as api:
        api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    return name


@pytest.fixture
def kubectl(kemu: KemuEndpoint, namespace: str, tmp_path: Path) -> Kubectl:
    """`kubectl(*args, input=None, check=True)` as the emulator's admin, in the test's namespace."""
    kubeconfig = kemu.kubeconfig_for(ADMIN_TOKEN, tmp_path / "kubeconfig.yaml", namespace)
    return kemu_fixtures.make_kubectl(KemuEndpoint(kemu.url, kubeconfig), tmp_path)


@pytest.fixture
def operators(kemu: KemuEndpoint, kubectl: Kubectl, tmp_path: Path) -> Iterator[Operators]:
    """Operators run by ``kopf run`` (no leader election) with storage that does not answer, each stopped with
    SIGTERM as a kubelet stops a pod; killed at the end."""
    install_crds(kemu, kubectl)
    ops = Operators(kemu, tmp_path)
    try:
        yield ops
    finally:
        ops.close()


@pytest.fixture(autouse=True)
def stop_stacks() -> Iterator[None]:
    """Every Stack a test started is killed when the test ends, pass or fail."""
    yield
    while Stack.started:
        Stack.started.pop().kill()


@pytest.fixture
def operator_env(
    kemu: KemuEndpoint, kubectl: Kubectl, namespace: str, s3_location: str, seaweed: Any, tmp_path: Path
) -> Iterator[tuple[Any, str]]:
    """``(start_operator, location)``: the CRDs installed, and a way to start ``gym-operator`` for the test's
    namespace with its storage at ``location`` (a fresh prefix in SeaweedFS)."""
    install_crds(kemu, kubectl)
    procs: list[subprocess.Popen[bytes]] = []

    def start_operator(
        stack: Any,
        kubeconfig: Path | None = None,
        log_name: str = "operator.log",
        gateway: int | None = None,
        verbose: bool = False,
        **settings: str,
    ) -> subprocess.Popen[bytes]:
        """The operator as a process (``gym-operator``, as the chart runs it); ``kubeconfig`` to run it as another
        identity, ``log_name`` its own log file, ``settings`` extra env. Returns once it leads the release (or,
        with ``standby=...`` in settings, once it answers its liveness probe); ``proc.health`` is its probe port.
        Leader election runs with short timings (a standby takes over a dead leader's Kubernetes Lease after
        8 s). ``gateway``: serve the storage gateway on that port (give ``GYMCKPT_GATEWAY_KEY`` in settings);
        ``verbose``: its debug logs too (kopf's among them)."""
        standby = settings.pop("standby", "")
        env = {
            **os.environ,
            **seaweed.env(),
            "KUBECONFIG": str(kubeconfig or kemu.kubeconfig),
            "GYMCKPT_CONTROL_TOKEN": stack.token,
            "GYMCKPT_STORAGE": s3_location,
            "GYMCKPT_RELEASE": RELEASE,
            **LEADER_TIMINGS,
            **settings,
        }
        health = free_port()
        command = [str(Path(sys.executable).parent / "gym-operator"), "--namespace", namespace]
        command += ["--liveness", f"http://127.0.0.1:{health}/healthz"] + (["--verbose"] if verbose else [])
        if gateway is not None:
            command += ["--storage-gateway", f"http://127.0.0.1:{gateway}"]
        with open(tmp_path / log_name, "ab") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        proc.health = health  # type: ignore[attr-defined]
        procs.append(proc)
        wait_for(
            lambda: proc.poll() is not None or (operator_live(health) and (standby or leads(health))),
            timeout=60,
            what="the operator to start and lead",
        )
        assert proc.poll() is None, (tmp_path / log_name).read_text()[-3000:]
        return proc

    yield start_operator, s3_location
    stop_processes(procs, signal.SIGTERM)
    log = tmp_path / "operator.log"
    if log.exists():
        print(log.read_text()[-4000:])
