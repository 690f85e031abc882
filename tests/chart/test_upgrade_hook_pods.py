"""The post-upgrade hook waits for the pods of every replica (issue 26, bug 2): the chart's own StatefulSets and
hook command, applied to the emulator; pods made by hand (the emulator runs no controller). On ce41d67 the hook
waited for `--pods 3` (a count of participant servers) while policy-model x3 and simple-agent x2 run 6 pods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
REVISION = "gym-checkpoint.dev/release-revision"


def test_the_restore_hook_waits_for_every_replica_at_the_new_revision(render: Any, kemu, kubectl, tmp_path) -> None:
    values = {
        "upgradeCheckpoint": {"enabled": True},
        "rollouts": {"enabled": False},
        "servers": [
            {"name": "policy-model", "server": "policy_model", "role": "model", "replicas": 3},
            {
                "name": "simple-agent",
                "server": "simple_agent",
                "role": "agent",
                "replicas": 2,
                "config": {"model_url": "http://x", "resources_url": "http://y"},
            },
            {"name": "workplace-assistant", "server": "workplace_assistant", "role": "resources"},
            {"name": "inference-worker", "server": "inference_worker", "participant": False, "replicas": 4},
        ],
    }
    docs = render(values, name="demo", namespace="default")
    statefulsets = [d for d in docs if d["kind"] == "StatefulSet"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(statefulsets))
    post = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("-post-upgrade"))
    command = post["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["gymckpt", "cluster", "restore"]
    checkpoint = command[command.index("--from") + 1]
    annotation = command[command.index("--pods-annotation") + 1]

    kubectl("apply", "-f", str(CRDS / "checkpoints.yaml"))
    kubectl("apply", "-f", str(CRDS / "restores.yaml"))
    kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Checkpoint",
                "metadata": {"name": checkpoint},
                "spec": {"release": "demo"},
            }
        ),
    )
    kubectl(
        "patch",
        "checkpoint",
        checkpoint,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Completed"}}),
    )

    def pod(sts: dict[str, Any], ordinal: int, revision: str) -> None:
        template = sts["spec"]["template"]
        name = f"{sts['metadata']['name']}-{ordinal}"
        kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": "default",
                        "labels": template["metadata"]["labels"],
                        "annotations": {**template["metadata"].get("annotations", {}), REVISION: revision},
                    },
                    "spec": {"containers": [{"name": "server", "image": "gym-checkpoint:test"}]},
                }
            ),
        )
        kubectl(
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        )

    def hook(timeout: str) -> subprocess.CompletedProcess:
        args = [*command[3:], "--no-wait"]  # (rendered for namespace default)
        args[args.index("--wait-timeout") + 1] = timeout
        env = {**os.environ, "KUBECONFIG": str(kemu.kubeconfig)}
        return subprocess.run(
            [str(Path(sys.executable).parent / "gymckpt"), "cluster", "restore", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    by_name = {s["metadata"]["name"].removeprefix("demo-gym-checkpoint-"): s for s in statefulsets}
    # one pod per participant server at the new revision, the other replicas still at the old one
    for name in ("policy-model", "simple-agent", "workplace-assistant"):
        pod(by_name[name], 0, annotation.split("=")[1])
    for ordinal in (1, 2):
        pod(by_name["policy-model"], ordinal, "old")
    pod(by_name["simple-agent"], 1, "old")
    waited = hook("3")
    assert waited.returncode == 1 and "only 3/6 participant pods ready" in waited.stderr, waited.stderr

    for ordinal in (1, 2):
        pod(by_name["policy-model"], ordinal, annotation.split("=")[1])
    pod(by_name["simple-agent"], 1, annotation.split("=")[1])
    done = hook("30")
    assert done.returncode == 0, done.stderr
    assert "6/6 participant pods ready" in done.stderr
