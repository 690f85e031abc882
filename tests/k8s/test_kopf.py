"""kopf, the operator framework the project uses, runs against kemu in namespaced mode.

A toy operator (not the project's) marks every new Checkpoint Completed. It checks what the real
operator relies on: `--namespace` mode with kopf's namespace and CRD observers, status patches, and
objects that existed before kopf started being handled exactly once (kemu's watch honours the
resourceVersion kopf lists at).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
OPERATOR = """
import kopf

@kopf.on.login()
def login(**kwargs):
    return kopf.login_with_kubeconfig(**kwargs)

@kopf.on.create('gym-checkpoint.dev', 'v1alpha1', 'checkpoints')
def created(name, patch, logger, **_):
    logger.info(f'HANDLED {name}')
    patch.status['phase'] = 'Completed'
"""


def wait_for(check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_kopf_handles_each_checkpoint_once_in_namespaced_mode(kemu: Any, kubectl: Any, tmp_path: Path) -> None:
    kubectl("apply", "-f", str(CRDS / "checkpoints.yaml"))
    kubectl("create", "namespace", "team")
    body = {"apiVersion": "gym-checkpoint.dev/v1alpha1", "kind": "Checkpoint", "spec": {"release": "gym"}}
    kubectl("-n", "team", "apply", "-f", "-", input=yaml.safe_dump({**body, "metadata": {"name": "before"}}))
    (tmp_path / "op.py").write_text(OPERATOR)
    log = (tmp_path / "kopf.log").open("w")
    kopf = Path(sys.executable).parent / "kopf"
    proc = subprocess.Popen(
        [str(kopf), "run", "--standalone", "--namespace", "team", str(tmp_path / "op.py")],
        env={**os.environ, "KUBECONFIG": str(kemu.kubeconfig)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = kemu.client(timeout=5)
    url = "/apis/gym-checkpoint.dev/v1alpha1/namespaces/team/checkpoints"
    try:
        wait_for(lambda: api.get(f"{url}/before").json().get("status", {}).get("phase") == "Completed")
        kubectl("-n", "team", "apply", "-f", "-", input=yaml.safe_dump({**body, "metadata": {"name": "after"}}))
        wait_for(lambda: api.get(f"{url}/after").json().get("status", {}).get("phase") == "Completed")
        time.sleep(1.0)  # room for a duplicate handling, which must not come
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        api.close()
    output = (tmp_path / "kopf.log").read_text()
    assert output.count("HANDLED before") == 1, output
    assert output.count("HANDLED after") == 1, output
    assert "Traceback" not in output and "APIServerError" not in output, output
