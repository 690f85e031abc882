"""The post-upgrade hook waits for the pods of every replica: the chart's own StatefulSets and
hook command, applied to the emulator; pods made by hand (the emulator runs no controller). On ce41d67 the hook
waited for `--pods 3` (a count of participant servers) while policy-model x3 and simple-agent x2 run 6 pods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


def test_the_checkpoint_hook_keeps_the_newest_of_its_checkpoints(render: Any, kemu, kubectl, tmp_path) -> None:
    """Hook-created Checkpoints no longer pile up: the pre-upgrade hook, once its Checkpoint
    completed, deletes all but `upgradeCheckpoint.keep` of the release's hook Checkpoints - never one that has not
    ended, one an unfinished Restore names, one of another release or one a user made. The hook's command as the
    chart renders it, against the emulator; the test plays the operator (it completes the new Checkpoint)."""
    docs = render({"upgradeCheckpoint": {"enabled": True, "keep": 2}}, name="demo", namespace="default")
    pre = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("-pre-upgrade"))
    command = pre["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["gymckpt", "cluster", "checkpoint"]
    kubectl("apply", "-f", str(CRDS))
    series = {"gym-checkpoint.dev/release": "demo", "gym-checkpoint.dev/created-by": "upgrade-hook"}

    def checkpoint(name: str, labels: dict[str, str], phase: str | None, release: str = "demo") -> None:
        body = {
            "apiVersion": "gym-checkpoint.dev/v1alpha1",
            "kind": "Checkpoint",
            "metadata": {"name": name, "labels": labels},
            "spec": {"release": release},
        }
        kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
        if phase:
            status = json.dumps({"status": {"phase": phase}})
            kubectl("patch", "checkpoint", name, "--subresource=status", "--type=merge", "-p", status)

    for name, labels, phase, release in (
        ("demo-r0", series, None, "demo"),  # not ended (its operator never ran it)
        ("demo-r1", series, "Completed", "demo"),
        ("demo-r2", series, "Failed", "demo"),
        ("demo-r3", series, "Completed", "demo"),  # an unfinished Restore names it
        ("demo-r4", series, "Completed", "demo"),
        ("manual", {"gym-checkpoint.dev/release": "demo"}, "Completed", "demo"),
        ("other-r1", series, "Completed", "other"),
    ):
        checkpoint(name, labels, phase, release)
        time.sleep(1.1)  # creationTimestamp has seconds: one per second orders the series
    restore = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "Restore",
        "metadata": {"name": "reads-r3"},
        "spec": {"release": "demo", "checkpointRef": {"name": "demo-r3"}},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(restore))

    env = {**os.environ, "KUBECONFIG": str(kemu.kubeconfig)}
    name = command[3]
    args = command[4:]
    args[args.index("--wait-timeout") + 1] = "60"
    hook = subprocess.Popen(
        [str(Path(sys.executable).parent / "gymckpt"), "cluster", "checkpoint", name, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while kubectl("get", "checkpoint", name, check=False).returncode != 0:
            assert time.monotonic() < deadline and hook.poll() is None, hook.communicate()
            time.sleep(0.2)
        created = json.loads(kubectl("get", "checkpoint", name, "-o", "json").stdout)
        assert created["metadata"]["labels"] == series and created["spec"]["deletionPolicy"] == "Retain"
        kubectl(
            "patch", "checkpoint", name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Completed", "checkpointId": f"{name}-1", "location": "s3://b/p"}}),
        )  # fmt: skip
        _, err = hook.communicate(timeout=90)
    finally:
        if hook.poll() is None:
            hook.kill()
            hook.wait()
    assert hook.returncode == 0, err
    left = set(kubectl("get", "checkpoints", "-o", "jsonpath={.items[*].metadata.name}").stdout.split())
    # kept: the 2 newest of the series (the new one, demo-r4), demo-r3 (read), demo-r0 (not ended), and everything
    # outside the series; deleted: demo-r2 (Failed) and demo-r1
    assert left == {name, "demo-r4", "demo-r3", "demo-r0", "manual", "other-r1"}, err
    assert "deleted Checkpoint demo-r2" in err and "deleted Checkpoint demo-r1" in err

    refused = subprocess.run(
        [
            str(Path(sys.executable).parent / "gymckpt"),
            "cluster",
            "checkpoint",
            "x",
            "--release",
            "demo",
            "--keep",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "--keep takes N >= 1 and needs --label" in refused.stderr
