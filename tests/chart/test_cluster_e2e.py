"""The chart on the emulated cluster, end to end: `helm install` with default values, a rollout job submitted
with `gymckpt collect --url` and running, then a preemption with nobody watching: the policy model's pod deleted with
its grace period (SIGTERM, SIGKILL at its end). The operator takes one final Checkpoint of the whole stack before the
pod goes, restores it by itself into the pods come back (a Resumed Event), and the job finishes with the results of
an uninterrupted run of the same install, with not one token generated twice.

Everything the chart renders runs for real (tests/chart/cluster.py): the Gym servers, the SeaweedFS store
behind its forwarder, the kopf operator, as local processes started from the rendered pod templates.
"""

from __future__ import annotations

import base64
import datetime as dt
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
MODEL = "gym-gym-checkpoint-policy-model-0"
CREATED_BY = "gym-checkpoint.dev/created-by"
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


def model_tokens(url: str, token: str) -> int:
    """The tokens the policy model has received from its inference worker since its process started (its status'
    live counts)."""
    status = httpx.get(f"{url}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {token}"})
    status.raise_for_status()
    return int(status.json()["live"]["tokens_generated"])


def tokens_at_exit(cluster: Cluster, pod: str) -> int:
    """The tokens the policy model had received when its process left after the termination checkpoint (its last
    log line says; nothing arrives after the cut)."""
    lines = (cluster.workdir / "pods" / pod / "server.log").read_text(errors="replace").splitlines()
    exits = [json.loads(line) for line in lines if '"msg": "exiting"' in line]
    assert len(exits) == 1, exits
    return int(exits[0]["live"]["tokens_generated"])


def collect(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return gymckpt(
        "collect", *args, "--url", url, "--repeats", str(REPEATS), "--concurrency", str(CONCURRENCY), token=token
    )


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.2)
    return value


def created_by(kubectl: Any, kind: str, who: str) -> list[dict[str, Any]]:
    return list(json.loads(kubectl("get", kind, "-l", f"{CREATED_BY}={who}", "-o", "json").stdout)["items"])


def uid(kubectl: Any, pod: str) -> str | None:
    found = kubectl("get", "pod", pod, "-o", "json", check=False)
    return str(json.loads(found.stdout)["metadata"]["uid"]) if found.returncode == 0 else None


def stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_helm_install_rollouts_a_pod_preempted_checkpointed_and_resumed_by_itself(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    # the reference: the same default install in its own namespace, nothing interrupted
    with Cluster(kemu, tmp_path / "reference", namespace="reference") as ref:
        assert install(kemu, "gym", "reference")["status"] == "deployed"
        ref.wait_ready(timeout_s=180)
        started = time.monotonic()
        url, token = ref.local_url("gym-gym-checkpoint-collection-0"), job_token(kubectl, "reference")
        collect(url, token, str(TASKS), "--output", str(tmp_path / "reference.jsonl"))  # (port-forward svc/... gives)
        reference_s = time.monotonic() - started
        reference_tokens = model_tokens(ref.local_url(MODEL, "control"), token)
    reference = results(tmp_path / "reference.jsonl")
    assert len(reference) == 5 * REPEATS and reference_tokens > 0

    with Cluster(kemu, tmp_path / "cluster") as cluster:
        installed = install(kemu, "gym", "default")
        assert installed["status"] == "deployed" and installed["revision"] == 1
        cluster.wait_ready(timeout_s=180)
        pods = {f"gym-gym-checkpoint-{name}-0" for name in SERVERS}
        assert pods <= set(cluster.pods) and "gym-gym-checkpoint-s3-0" in cluster.pods
        url, token = cluster.local_url("gym-gym-checkpoint-collection-0"), job_token(kubectl, "default")
        submitted = collect(url, token, str(TASKS), "--no-wait")
        assert "uploaded 5 tasks" in submitted.stderr and f"collecting {5 * REPEATS} rollouts" in submitted.stdout
        auth = {"authorization": f"Bearer {token}"}
        job = wait_for(
            lambda: (j := httpx.get(f"{url}/jobs/current", headers=auth, timeout=10).json())["finished"] >= 2 and j,
            reference_s,
            "a wave done",
        )
        assert job["state"] == "running" and job["finished"] < job["total"] and job["live"] > 0, job

        # a preemption of the policy model's pod (deleted with the chart's grace period, 60 s); nobody types a thing
        kubectl("delete", "pod", MODEL, "--wait=false")
        victim = json.loads(kubectl("get", "pod", MODEL, "-o", "json").stdout)["metadata"]
        (checkpoint,) = wait_for(lambda: created_by(kubectl, "checkpoints", "termination"), 30, "a termination")
        name = checkpoint["metadata"]["name"]
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/{name}", "--timeout=60s", timeout=70)
        checkpoint = json.loads(kubectl("get", "checkpoint", name, "-o", "json").stdout)
        spec, status = checkpoint["spec"], checkpoint["status"]
        # one transaction of the whole stack (the collection's cursor and the episodes live at the signal), final
        assert spec["final"] is True and status["final"] is True and status["participantCount"] == 4, status
        assert stamp(status["completionTime"]) <= stamp(spec["deadline"]) < stamp(victim["deletionTimestamp"])
        collection = [p for p in status["participants"] if p["role"] == "controller"]
        assert collection[0]["records"] > 1, status

        # the policy model left once its part was stored (before its grace ran out); the other servers held the
        # final checkpoint until its lease ran out and restarted; the operator restores the stack by itself
        wait_for(lambda: uid(kubectl, MODEL) not in (None, victim["uid"]), 60, "the pod made again")
        tokens_before_cut = tokens_at_exit(cluster, MODEL)
        (restore,) = wait_for(lambda: created_by(kubectl, "restores", "auto-restore"), 120, "an automatic Restore")
        resume = restore["metadata"]["name"]
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"restore/{resume}", "--timeout=120s", timeout=130)
        restore = json.loads(kubectl("get", "restore", resume, "-o", "json").stdout)
        assert restore["spec"]["checkpointRef"] == {"name": name}
        restored = restore["status"]
        assert restored["attempt"] == 1 and restored["restoredEpisodes"] >= 1
        events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
        resumed = [e["message"] for e in events if e["reason"] == "Resumed" and e["involvedObject"]["name"] == resume]
        assert resumed and status["checkpointId"] in resumed[0], resumed

        finished = gymckpt(
            "collect", "--attach", "--url", url, "--output", str(tmp_path / "resumed.jsonl"), "--wait-timeout", "240",
            token=token,
        )  # fmt: skip
        assert f"collected {5 * REPEATS} rollouts (0 errors)" in finished.stdout
        tokens_after_restore = model_tokens(cluster.local_url(MODEL, "control"), token)
        assert not cluster.errors, cluster.errors
    resumed_rows = results(tmp_path / "resumed.jsonl")
    assert set(resumed_rows) == set(reference)
    assert {rid: comparable(row) for rid, row in resumed_rows.items()} == {
        rid: comparable(row) for rid, row in reference.items()
    }
    # the episodes live at the signal finished as attempt 1, with the very answers of the uninterrupted run
    continued = [rid for rid, row in resumed_rows.items() if row["_ng_attempt_index"] == 1]
    assert continued and len(continued) == restored["restoredEpisodes"], (continued, restored)
    # nothing generated twice: every token of the run was generated before the cut (and kept) or after the restore
    assert tokens_before_cut > 0 and tokens_before_cut + tokens_after_restore == reference_tokens
