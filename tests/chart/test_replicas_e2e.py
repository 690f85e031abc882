"""The chart with replicas on the emulated cluster: `helm install` with two pods of every server but the
collection (two inference workers behind two policy models, two Workplace Assistants, two agents), a rollout job
with a Checkpoint, every pod replaced and a Restore: the operator finds every replica, each is its own participant
in both (the status names its replica), every rollout's state is on the pod its id hashes to, and every episode
continued after the restore ends exactly as the same task's episodes that ran uninterrupted (the oracle policy
answers a task the same way every time, so no separate reference install is needed: test_cluster_e2e.py compares
with one). A StatefulSet scaled outside the chart is refused; then the agents are scaled down with the chart and a
Restore of the same checkpoint is refused, saying why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chart.cluster import Cluster
from tests.chart.test_cluster_e2e import TASKS, gymckpt, install, job_token, results
from tests.chart.test_helm_install import helm_call

from gym_services.base.affinity import replica_for
from gym_services.control.manifests import parse_participant_manifest
from gym_services.control.models import PackedManifest

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

REPLICATED = ("inference-worker", "policy-model", "workplace-assistant", "simple-agent")
COPIES, CONCURRENCY = 4, 8  # the example's 5 tasks 4 times over, one episode each: a task's copies are 5 lines apart,
EPISODES = 5 * COPIES  # so an episode live at the checkpoint has copies that ran uninterrupted


def values(replicas: int, agents: int | None = None) -> dict[str, Any]:
    """The chart's default servers, each with ``replicas`` pods (the agent with ``agents``, if given)."""
    url = '{{ include "gym-checkpoint.serverUrl" (dict "root" $ "name" "%s") }}'
    return {
        "servers": [
            {
                "name": "inference-worker",
                "server": "inference_worker",
                "participant": False,
                "port": 8000,
                "replicas": replicas,
                "config": {"tokens_per_second": 100.0, "time_to_first_token_s": 0.05},
            },
            {
                "name": "policy-model",
                "server": "policy_model",
                "role": "model",
                "port": 8000,
                "replicas": replicas,
                "config": {"upstream": {"base_url": url % "inference-worker" + "/v1", "health_interval_s": 0.5}},
            },
            {
                "name": "workplace-assistant",
                "server": "workplace_assistant",
                "role": "resources",
                "port": 8000,
                "replicas": replicas,
                "config": {"tool_latency_s": 0.1},
            },
            {
                "name": "simple-agent",
                "server": "simple_agent",
                "role": "agent",
                "port": 8000,
                "replicas": agents or replicas,
                "config": {
                    "model_url": url % "policy-model",
                    "model": "workplace-oracle",
                    "resources_url": url % "workplace-assistant",
                    "max_steps": 12,
                },
            },
        ],
        # restores by hand here (what a Restore into other replica counts says); the automatic path:
        # test_cluster_e2e.py, test_termination_e2e.py
        "termination": {"checkpoint": False},
        "autoRestore": {"enabled": False},
    }


def kubectl_json(kubectl: Any, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def apply(kubectl: Any, kind: str, name: str, spec: dict[str, Any]) -> None:
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": {"release": "gym", **spec},
            }
        ),
    )


def test_replicas_install_checkpoint_replace_restore_and_refuse_other_counts(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    with Cluster(kemu, tmp_path / "cluster") as cluster:
        assert install(kemu, "gym", "default", values(2))["status"] == "deployed"
        cluster.wait_ready(timeout_s=180)
        pods = {f"gym-gym-checkpoint-{name}-{i}" for name in REPLICATED for i in (0, 1)} | {
            "gym-gym-checkpoint-collection-0"
        }
        assert pods <= set(cluster.pods)
        url = cluster.local_url("gym-gym-checkpoint-collection-0")
        token = job_token(kubectl, "default")
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text("".join(line + "\n" for line in TASKS.read_text().splitlines() * COPIES if line.strip()))
        gymckpt("collect", str(tasks), "--url", url, "--concurrency", str(CONCURRENCY), "--no-wait", token=token)
        deadline = time.monotonic() + 120
        auth = {"authorization": f"Bearer {token}"}
        while (job := httpx.get(f"{url}/jobs/current", headers=auth, timeout=10).json())["finished"] < 1:
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["state"] == "running" and job["live"] > 0, job

        apply(kubectl, "Checkpoint", "ck1", {"prepareTimeoutSeconds": 60, "leaseSeconds": 60})
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/ck1", "--timeout=120s", timeout=130)
        checkpoint = kubectl_json(kubectl, "get", "checkpoint", "ck1")["status"]
        participants = {p["id"]: p for p in checkpoint["participants"]}
        # every replica is its own participant (the workers are no participants), and the status says which one
        assert set(participants) == pods - {f"gym-gym-checkpoint-inference-worker-{i}" for i in (0, 1)}, participants
        assert checkpoint["participantCount"] == 7
        for pid, entry in participants.items():
            server = pid.removeprefix("gym-gym-checkpoint-").rsplit("-", 1)[0]
            count = 1 if server == "collection" else 2
            assert entry["replica"] == {"group": server, "ordinal": int(pid.rsplit("-", 1)[1]), "replicas": count}, (
                entry
            )
        assert checkpoint["replicas"] == {
            "collection": 1,
            "policy-model": 2,
            "simple-agent": 2,
            "workplace-assistant": 2,
        }
        # each replica's own live episodes; together the job's (the collection tracks every live one)
        agents = [participants[f"gym-gym-checkpoint-simple-agent-{i}"]["episodes"] for i in (0, 1)]
        assert sum(agents) == participants["gym-gym-checkpoint-collection-0"]["episodes"] == checkpoint["episodes"] > 0

        # rollout affinity: each rollout's records are on the pod its id hashes to
        store = checkpoint["location"]
        manifest = json.loads(cluster.read_object(store, f"checkpoints/{checkpoint['checkpointId']}/manifest.json"))
        placed = 0
        for entry in manifest["participants"]:
            replica = entry["replica"]
            assert replica is not None and replica["replicas"] in (1, 2), entry
            parsed = parse_participant_manifest(cluster.read_object(store, entry["manifest_key"]))
            rollouts = (
                list(parsed.records.rollout_ids)
                if isinstance(parsed, PackedManifest)
                else [r.rollout_id for r in parsed.records]
            )
            for rollout_id in rollouts:
                if rollout_id and replica["replicas"] == 2:
                    assert replica_for(rollout_id, 2) == replica["ordinal"], (entry["participant_id"], rollout_id)
                    placed += 1
        assert placed > 0

        # the agents' StatefulSet scaled outside the chart: its pods still say 2, and a Checkpoint is refused at once
        scale = (
            "patch",
            "statefulset",
            "gym-gym-checkpoint-simple-agent",
            "--type=merge",
            "-p",
        )  # (kubectl scale: no such subresource here)
        kubectl(*scale, '{"spec": {"replicas": 3}}')
        apply(kubectl, "Checkpoint", "scaled", {"prepareTimeoutSeconds": 60})
        kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/scaled", "--timeout=60s", timeout=70)
        scaled = kubectl_json(kubectl, "get", "checkpoint", "scaled")["status"]
        assert scaled["reason"] == "ReplicaCountMismatch", scaled
        assert (
            "simple-agent: StatefulSet gym-gym-checkpoint-simple-agent has replicas 3 but its pod" in scaled["message"]
        )
        kubectl(*scale, '{"spec": {"replicas": 2}}')

        # every participant pod dies and is replaced by a fresh one (the workers are no participants: they stay)
        participant_pods = sorted(participants)
        cluster.replace_pods(participant_pods)
        cluster.wait_ready(set(participant_pods), timeout_s=180)
        apply(kubectl, "Restore", "rs1", {"checkpointRef": {"name": "ck1"}})
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/rs1", "--timeout=120s", timeout=130)
        restored = kubectl_json(kubectl, "get", "restore", "rs1")["status"]
        assert restored["restoredEpisodes"] >= 1
        assert {p["id"] for p in restored["participants"]} == set(participants)
        assert all(
            p["replica"]["replicas"] == participants[p["id"]]["replica"]["replicas"] for p in restored["participants"]
        )
        finished = gymckpt(
            "collect",
            "--attach",
            "--url",
            url,
            "--output",
            str(tmp_path / "checkpointed.jsonl"),
            "--wait-timeout",
            "180",
            token=token,
        )
        assert f"collected {EPISODES} rollouts (0 errors)" in finished.stdout

        # one agent now (helm upgrade): the checkpoint of two cannot be restored here, and the Restore says why
        cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
        try:
            upgraded = helm_call(
                cfg, "helm_upgrade", "gym", values(2, agents=1), timeout_seconds=60, disable_hooks=True
            )
            assert upgraded["status"] == "deployed"
        finally:
            cfg.close()
        deadline = time.monotonic() + 120
        while "gym-gym-checkpoint-simple-agent-1" in cluster.pods and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.wait_ready(set(participant_pods) - {"gym-gym-checkpoint-simple-agent-1"}, timeout_s=180)
        apply(kubectl, "Restore", "rs2", {"checkpointRef": {"name": "ck1"}})
        kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "restore/rs2", "--timeout=120s", timeout=130)
        refused = kubectl_json(kubectl, "get", "restore", "rs2")["status"]
        assert (
            "other replica counts" in refused["message"]
            and "simple-agent: 2 in the checkpoint, 1 here" in refused["message"]
        )
        assert not cluster.errors, cluster.errors

    checkpointed = results(tmp_path / "checkpointed.jsonl")
    assert len(checkpointed) == EPISODES
    continued = [rid for rid, row in checkpointed.items() if row["_ng_attempt_index"] == 1]
    assert continued and len(continued) == restored["restoredEpisodes"], (continued, restored)
    # a continued episode ends as its task's uninterrupted copies: same reward and every model output and tool result
    answers: dict[str, set[str]] = {}
    for row in checkpointed.values():
        answers.setdefault(task_of(row), set()).add(
            json.dumps((row["reward"], row["agent"], row["result"], row.get("error")))
        )
    assert len(answers) == 5 and all(len(a) == 1 for a in answers.values()), answers
    uninterrupted = {task_of(row) for row in checkpointed.values() if row["_ng_attempt_index"] == 0}
    assert {task_of(checkpointed[rid]) for rid in continued} <= uninterrupted


def task_of(row: dict[str, Any]) -> str:
    """The task an episode ran (its input), whichever copy of it in the tasks file."""
    return json.dumps(row["result"]["responses_create_params"]["input"], sort_keys=True)
