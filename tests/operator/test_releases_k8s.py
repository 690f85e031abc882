"""The operator of a release, as the chart installs it: two releases in one namespace keep to their own resources
and pods, and an operator under the chart's Role uses exactly what the Role grants."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    RELEASE,
    Stack,
    apply,
    chart_operator_identity,
    checkpoint_doc,
    checkpoint_without_the_operator,
    finalizer_of,
    get,
    own_by_statefulset,
    resource,
    restore_of,
    stored_objects,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_two_releases_in_one_namespace_each_checkpoint_and_restore_only_their_own(
    operator_env, kubectl, tmp_path, seaweed
) -> None:
    """Releases alpha and beta share the namespace, each with its operator: each operator runs only the
    Checkpoints and Restores naming its release (no Event, no finalizer, no status on the others'), on its own
    release's pods; a Restore of the other release's Checkpoint is refused. Each Checkpoint (`deletionPolicy:
    Delete`, so its operator is needed at its deletion) holds exactly its own release's finalizer."""
    start_operator, location = operator_env
    stacks = {}
    for release, pods in (("alpha", ["alpha-0", "alpha-1"]), ("beta", ["beta-0"])):
        (tmp_path / release).mkdir()
        stacks[release] = Stack(tmp_path / release, kubectl, {pod: "exported" for pod in pods}, release=release)
        stacks[release].start()
        stacks[release].create_pods()
        start_operator(stacks[release], GYMCKPT_RELEASE=release)
    cookies = {}
    for stack in stacks.values():
        for name in stack.modes:
            with httpx.Client(base_url=stack.url(name)) as http:
                http.post("/seed_session", json={"start": 100}, headers={"x-ng-rollout-id": name}).raise_for_status()
                cookies[name] = dict(http.cookies)
    for release in stacks:
        apply(
            kubectl, checkpoint_doc(f"ck-{release}", release=release, prepareTimeoutSeconds=10, deletionPolicy="Delete")
        )
    for release, stack in stacks.items():
        kubectl(
            "wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/ck-{release}", "--timeout=60s", timeout=70
        )
        done = get(kubectl, "checkpoint", f"ck-{release}")
        assert sorted(p["id"] for p in done["status"]["participants"]) == sorted(stack.modes)
        wait_for(
            lambda r=release: get(kubectl, "checkpoint", f"ck-{r}")["metadata"].get("finalizers") == [finalizer_of(r)],
            what=f"exactly release {release}'s finalizer",
        )
    bucket, prefix = location[len("s3://") :].split("/", 1)
    keys = [o["Key"] for o in seaweed.client().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    for release, stack in stacks.items():
        checkpoint_id = get(kubectl, "checkpoint", f"ck-{release}")["status"]["checkpointId"]
        assert sum(f"/{checkpoint_id}/" in k and "/packs/" in k for k in keys) == len(stack.modes), keys
    # the other operator wrote nothing on it: one Completed Event per Checkpoint, no failure of any kind
    events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    for release in stacks:
        mine = [e for e in events if e["involvedObject"]["name"] == f"ck-{release}"]
        assert [e["reason"] for e in mine].count("Completed") == 1 and all(e["type"] == "Normal" for e in mine), mine

    for stack in stacks.values():  # every server restarts empty
        stack.kill()
        stack.start()
    apply(kubectl, restore_of("rs-stolen", "ck-alpha", release="beta"))
    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "restore/rs-stolen", "--timeout=60s", timeout=70)
    stolen = get(kubectl, "restore", "rs-stolen")["status"]
    assert stolen["reason"] == "CheckpointOfAnotherRelease" and "alpha" in stolen["message"]
    for release in stacks:
        apply(kubectl, restore_of(f"rs-{release}", f"ck-{release}", release=release))
    for release, stack in stacks.items():
        kubectl(
            "wait", "--for=jsonpath={.status.phase}=Completed", f"restore/rs-{release}", "--timeout=60s", timeout=70
        )
        assert get(kubectl, "restore", f"rs-{release}")["status"]["restoredEpisodes"] == len(stack.modes)
        for name in stack.modes:
            with httpx.Client(base_url=stack.url(name), cookies=cookies[name]) as http:
                ident = {"x-ng-rollout-id": name, "x-ng-attempt": "1"}
                assert http.post("/increment", json={"by": 1}, headers=ident).json() == {"output": 101}


def test_the_whole_operator_flow_under_the_charts_role_uses_exactly_what_it_grants(
    operator_env, kemu, kubectl, namespace, seaweed, tmp_path
) -> None:
    """The operator runs with the chart's ServiceAccount token, Role and settings (kopf scanning off, one storage
    location with its own credentials Secret, autoRestore and termination checkpoints on), through everything it
    does: the location validated (its status) and its stored checkpoint synced as a Checkpoint (create), a Checkpoint
    to that location (reading that Secret), the automatic Restore of the stack come back fresh, a Checkpoint naming a
    location the admin never defined, a Checkpoint deleted with its data, one whose ttl runs out, a
    CheckpointSchedule's run, a pod's DisruptionTarget condition (a termination checkpoint); then it stops (and checks
    whether its namespace and Deployment are going away).
    Every request it made was allowed, and every rule of the Role was used (the emulator's audit): the Role is
    exactly what it uses."""
    start_operator, location = operator_env
    team = {"url": location, "endpoint": seaweed.endpoint, "existingSecret": "team-s3"}
    kubeconfig, settings, role = chart_operator_identity(
        kemu, kubectl, namespace, tmp_path, {"storage": {"locations": {"team": team}}}
    )
    keys = seaweed.env()
    for name in ("team-s3", "other-s3"):
        kubectl(
            "create",
            "secret",
            "generic",
            name,
            f"--from-literal=AWS_ACCESS_KEY_ID={keys['AWS_ACCESS_KEY_ID']}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={keys['AWS_SECRET_ACCESS_KEY']}",
        )
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    own_by_statefulset(kubectl, "counter-0", "counter", replicas=1)  # the operator lists StatefulSets
    checkpoint_without_the_operator(stack, location, "from-before")
    operator = start_operator(stack, kubeconfig, **settings)
    try:
        wait_for(
            lambda: (
                "Completed"
                in kubectl("get", "checkpoint", "from-before", "-o", "jsonpath={.status.phase}", check=False).stdout
            ),
            timeout=60,
            what="the catalog sync to make a Checkpoint of the stored checkpoint",
        )
        assert get(kubectl, "checkpointstoragelocation", f"{RELEASE}-gym-checkpoint-team")["status"]["phase"] == (
            "Available"
        )
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 5}, headers={"x-ng-rollout-id": "r0"})
        apply(
            kubectl, checkpoint_doc("least", prepareTimeoutSeconds=10, deletionPolicy="Delete", storageLocation="team")
        )
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/least", "--timeout=60s", timeout=70)
        status = get(kubectl, "checkpoint", "least")["status"]
        assert status["participantCount"] == 1 and status["checkpointId"].startswith("least-")
        assert stored_objects(seaweed, location, status["checkpointId"])

        stack.kill()
        stack.start()  # fresh: the operator restores it by itself
        restores = wait_for(
            lambda: json.loads(kubectl("get", "restores", "-o", "json").stdout)["items"], 60, "the automatic Restore"
        )
        automatic = restores[0]["metadata"]["name"]
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"restore/{automatic}", "--timeout=60s", timeout=70)
        assert restores[0]["spec"]["checkpointRef"] == {"name": "least"}

        apply(kubectl, checkpoint_doc("stranger", storageLocation="other"))
        kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/stranger", "--timeout=60s", timeout=70)
        stranger = get(kubectl, "checkpoint", "stranger")["status"]
        assert stranger["reason"] == "UnknownStorageLocation" and "storage.locations" in stranger["message"]

        kubectl("delete", "checkpoint", "least", timeout=60)
        assert not stored_objects(seaweed, location, status["checkpointId"])

        apply(kubectl, checkpoint_doc("brief", prepareTimeoutSeconds=10, ttl="6s"))
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/brief", "--timeout=60s", timeout=70)
        wait_for(
            lambda: kubectl("get", "checkpoint", "brief", check=False).returncode != 0,
            timeout=30,
            what="the operator to delete the expired Checkpoint",
        )
        assert "Completed" in kubectl("get", "events", "-o", "json").stdout

        schedule = {"schedule": "@every 10s", "keep": 1, "template": {"prepareTimeoutSeconds": 5}}
        apply(kubectl, resource("CheckpointSchedule", "often", **schedule))
        wait_for(
            lambda: get(kubectl, "checkpointschedule", "often").get("status", {}).get("lastSuccessfulCheckpoint"),
            timeout=40,
            what="a scheduled checkpoint",
        )
        kubectl("delete", "checkpointschedule", "often")
        disruption = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
        kubectl(
            "patch", "pod", "counter-0", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": [disruption]}}),
        )  # fmt: skip
        terminations = wait_for(
            lambda: json.loads(
                kubectl("get", "checkpoints", "-l", "gym-checkpoint.dev/created-by=termination", "-o", "json").stdout
            )["items"],
            30,
            "the termination checkpoint",
        )
        final = terminations[0]["metadata"]["name"]
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/{final}", "--timeout=60s", timeout=70)
        os.killpg(operator.pid, signal.SIGTERM)  # as the kubelet stops its pod
        assert operator.wait(timeout=60) == 0
    finally:
        stack.kill()
    account = f"system:serviceaccount:{namespace}:{RELEASE}-gym-checkpoint-operator"
    audit = kemu.audit(user=account)
    refused = [e for e in audit if e["code"] in (401, 403)]
    assert not refused, refused
    used = {
        (e["verb"], e["resource"] + (f"/{e['subresource']}" if e["subresource"] else ""))
        for e in audit
        if e["resource"]
    }
    granted = {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert used <= granted, used - granted  # (RBAC refused nothing, so this holds; the next line is the point)
    assert granted <= used, f"the Role grants what the operator never used: {sorted(granted - used)}"
    secrets = {e["name"] for e in audit if e["resource"] == "secrets"}
    assert secrets == {"team-s3"}
    assert "Forbidden" not in (tmp_path / "operator.log").read_text()
