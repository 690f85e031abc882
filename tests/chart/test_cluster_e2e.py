"""The chart on the emulated cluster, end to end: `helm install` with default values, a rollout job submitted
with `gymckpt collect --url` and running, a Checkpoint Completed, every server pod replaced, a Restore
Completed, and the job finishing with the results of an uninterrupted run of the same install.

Everything the chart renders runs for real (tests/chart/cluster.py): the Gym servers, the SeaweedFS store
behind its forwarder, the kopf operator, as local processes started from the rendered pod templates.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chart.cluster import Cluster
from tests.chart.test_helm_install import helm_call

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "gym_services"
TASKS = PACKAGE / "resources" / "workplace_assistant" / "data" / "example.jsonl"
SERVERS = ("inference-worker", "policy-model", "workplace-assistant", "simple-agent", "collection")
REPEATS, CONCURRENCY = 6, 6  # 30 episodes in five waves: the checkpoint lands mid-job


def gymckpt(*args: str, token: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "gymckpt"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "GYMCKPT_JOB_TOKEN": token},
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def job_token(kubectl: Any, namespace: str) -> str:
    """The collection server's job token: the release's control token, as an operator reads it."""
    encoded = kubectl(
        "get", "secret", "-n", namespace, "gym-gym-checkpoint-generated", "-o", "jsonpath={.data.token}"
    ).stdout
    return base64.b64decode(encoded).decode()


def install(kemu: Any, release: str, namespace: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=namespace)
    try:
        return helm_call(cfg, "helm_install", release, values or {}, timeout_seconds=60)
    finally:
        cfg.close()


def results(path: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_id = {row["_ng_rollout_id"]: row for row in rows}
    assert len(by_id) == len(rows), "an episode has two results"
    return by_id


def comparable(row: dict[str, Any]) -> Any:
    """What must not depend on a checkpoint: the reward and the agent's whole answer (every model output, tool
    call and tool result); only ``_ng_attempt_index`` may differ."""
    return (
        row["reward"],
        row["_ng_task_index"],
        row["_ng_rollout_index"],
        row["agent"],
        row.get("result"),
        row.get("error"),
    )


def test_helm_install_rollouts_checkpoint_replace_pods_restore(kemu: Any, kubectl: Any, tmp_path: Path) -> None:
    # the reference: the same default install in its own namespace, nothing interrupted
    with Cluster(kemu, tmp_path / "reference", namespace="reference") as ref:
        assert install(kemu, "gym", "reference")["status"] == "deployed"
        ref.wait_ready(timeout_s=180)
        started = time.monotonic()
        url = ref.local_url("gym-gym-checkpoint-collection-0")  # what `kubectl port-forward svc/...` gives
        gymckpt(
            "collect",
            str(TASKS),
            "--url",
            url,
            "--repeats",
            str(REPEATS),
            "--concurrency",
            str(CONCURRENCY),
            "--output",
            str(tmp_path / "reference.jsonl"),
            token=job_token(kubectl, "reference"),
        )
        reference_s = time.monotonic() - started
    reference = results(tmp_path / "reference.jsonl")
    assert len(reference) == 5 * REPEATS

    with Cluster(kemu, tmp_path / "cluster") as cluster:
        installed = install(kemu, "gym", "default")
        assert installed["status"] == "deployed" and installed["revision"] == 1
        cluster.wait_ready(timeout_s=180)
        pods = {f"gym-gym-checkpoint-{name}-0" for name in SERVERS}
        assert pods <= set(cluster.pods) and "gym-gym-checkpoint-s3-0" in cluster.pods
        url = cluster.local_url("gym-gym-checkpoint-collection-0")
        token = job_token(kubectl, "default")
        submitted = gymckpt(
            "collect",
            str(TASKS),
            "--url",
            url,
            "--repeats",
            str(REPEATS),
            "--concurrency",
            str(CONCURRENCY),
            "--no-wait",
            token=token,
        )
        assert "uploaded 5 tasks" in submitted.stderr and f"collecting {5 * REPEATS} rollouts" in submitted.stdout
        deadline = time.monotonic() + reference_s
        auth = {"authorization": f"Bearer {token}"}
        while (job := httpx.get(f"{url}/jobs/current", headers=auth, timeout=10).json())[
            "finished"
        ] < 2:  # a wave is done
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["state"] == "running" and job["finished"] < job["total"] and job["live"] > 0, job

        kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "gym-checkpoint.dev/v1alpha1",
                    "kind": "Checkpoint",
                    "metadata": {"name": "ck1"},
                    "spec": {"release": "gym", "prepareTimeoutSeconds": 60, "leaseSeconds": 60},
                }
            ),
        )
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/ck1", "--timeout=120s", timeout=130)
        checkpoint = json.loads(kubectl("get", "checkpoint", "ck1", "-o", "json").stdout)["status"]
        assert checkpoint["participantCount"] == 4 and checkpoint["location"] == "s3://gym-checkpoints/gym"
        collection = [p for p in checkpoint["participants"] if p["role"] == "controller"]
        assert collection[0]["records"] > 1, checkpoint  # the job's cursor and the episodes live at the checkpoint

        # every server pod dies and is replaced by a fresh one (the collection keeps its volume)
        old_pids = {name: [proc.pid for proc in cluster.pods[name].procs] for name in pods}
        cluster.replace_pods(sorted(pods))
        cluster.wait_ready(pods, timeout_s=180)
        assert all([proc.pid for proc in cluster.pods[name].procs] != old_pids[name] for name in pods)

        kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "gym-checkpoint.dev/v1alpha1",
                    "kind": "Restore",
                    "metadata": {"name": "rs1"},
                    "spec": {"release": "gym", "checkpointRef": {"name": "ck1"}},
                }
            ),
        )
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/rs1", "--timeout=120s", timeout=130)
        restored = json.loads(kubectl("get", "restore", "rs1", "-o", "json").stdout)["status"]
        assert restored["attempt"] == 1 and restored["restoredEpisodes"] >= 1

        finished = gymckpt(
            "collect",
            "--attach",
            "--url",
            url,
            "--output",
            str(tmp_path / "checkpointed.jsonl"),
            "--wait-timeout",
            "240",
            token=token,
        )
        assert f"collected {5 * REPEATS} rollouts (0 errors)" in finished.stdout
        assert not cluster.errors, cluster.errors
    checkpointed = results(tmp_path / "checkpointed.jsonl")
    assert set(checkpointed) == set(reference)
    assert {rid: comparable(row) for rid, row in checkpointed.items()} == {
        rid: comparable(row) for rid, row in reference.items()
    }
    # the episodes live at the checkpoint finished as attempt 1, with the very answers of the uninterrupted run
    continued = [rid for rid, row in checkpointed.items() if row["_ng_attempt_index"] == 1]
    assert continued and len(continued) == restored["restoredEpisodes"], (continued, restored)
