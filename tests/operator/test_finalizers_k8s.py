"""Finalizers (gym_operator.controllers.context.finalizer_of): each release's operator holds a finalizer of its own, and
only while it has work at the resource's deletion, so two releases in one namespace never fight over one and an
uninstall never waits for resources at rest.

Its own emulator: the test compacts the watch history, which every watch of the emulator sees."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
import yaml
from tests.operator.harness import RELEASE, Operators, completed_earlier, finalizer_of, resource, wait_for

LEGACY_FINALIZER = "gym-checkpoint.dev/operator"

pytestmark = pytest.mark.k8s

#: how long the resources must stay untouched once settled: two of the operators' watches end and are re-opened in
#: it (GYMCKPT_WATCH_TIMEOUT_SECONDS=5), and an etcd compaction makes both re-list every resource in its middle
#: (a 410 on the resumed watch), which is when kopf re-decides every resource's finalizer. A fight shows at once:
#: on the old code, thousands of patches in the first seconds. 12 s in the suite; `GYMCKPT_QUIET_WINDOW_S=60` runs
#: it over a whole minute.
QUIET_WINDOW_S = float(os.environ.get("GYMCKPT_QUIET_WINDOW_S", "12"))


def _metadata(kubectl: Any, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", "checkpoint", name, "-o", "json").stdout)["metadata"])


def test_two_releases_in_one_namespace_never_touch_each_others_finalizers(
    operators: Operators, kemu: Any, kubectl: Any, namespace: str
) -> None:
    """Releases alpha and beta, an operator each, a Checkpoint each that needs its operator at its deletion
    (`deletionPolicy: Delete` with stored data) and one at rest (Retain, completed): each needed Checkpoint carries
    exactly its release's finalizer, the resting one none, and once settled nothing writes to any of them for the
    window (no patch at all, resourceVersion unchanged), across watch restarts and a re-list. Before, both operators
    added and removed one shared finalizer for ever (kopf strips its finalizer from what no handler of its matches)."""
    for release in ("alpha", "beta"):
        operators.start(namespace, GYMCKPT_RELEASE=release, GYMCKPT_WATCH_TIMEOUT_SECONDS="5")
        completed_earlier(kubectl, namespace, f"data-{release}", release=release, deletionPolicy="Delete")
        completed_earlier(kubectl, namespace, f"rest-{release}", release=release)
    for release in ("alpha", "beta"):
        wait_for(
            lambda r=release: _metadata(kubectl, f"data-{r}").get("finalizers") == [finalizer_of(r)],
            what=f"release {release}'s finalizer",
        )
    time.sleep(2.0)  # settled: whatever the operators still had queued is written
    before = {name: _metadata(kubectl, name) for name in ("data-alpha", "data-beta", "rest-alpha", "rest-beta")}
    started = time.time()
    time.sleep(QUIET_WINDOW_S / 2)
    compacted = time.time()
    kubectl("create", "configmap", "unrelated")  # a revision past what the Checkpoint watches last saw
    kemu.compact()
    time.sleep(QUIET_WINDOW_S / 2)
    audit = kemu.audit()
    writes = [
        e for e in audit if e["time"] >= started and e["resource"] == "checkpoints" and e["verb"] in ("patch", "update")
    ]
    assert not writes, f"{len(writes)} writes in the quiet window, e.g. {writes[:3]}"
    for name, meta in before.items():
        now = _metadata(kubectl, name)
        assert now["resourceVersion"] == meta["resourceVersion"], name
        release = name.split("-")[1]
        expected = [finalizer_of(release)] if name.startswith("data-") else []
        assert (now.get("finalizers") or []) == expected, (name, now.get("finalizers"))
    relists = [e for e in audit if e["time"] >= compacted and e["resource"] == "checkpoints" and e["verb"] == "list"]
    assert len(relists) >= 2, "the compaction did not make both operators list the Checkpoints again"


def test_resources_at_rest_carry_no_finalizer_and_one_that_needs_it_gets_it(
    operators: Operators, kubectl: Any, namespace: str
) -> None:
    """A completed Checkpoint with `deletionPolicy: Retain` (the default) and a failed Restore need nothing of the
    operator at their deletion: no finalizer, so they go at once, whatever happened to the operator. A Checkpoint
    whose deletionPolicy is changed to Delete gets the finalizer, and loses it when changed back. The finalizer older
    operators shared is taken off the release's resources, never off another release's."""
    legacy = {"metadata": {"finalizers": [LEGACY_FINALIZER]}}
    for name, release in (("inherited", RELEASE), ("anothers", "other")):  # as an older operator left them
        kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(resource("Checkpoint", name, release=release))
        )
        kubectl("patch", "checkpoint", name, "--type=merge", "-p", json.dumps(legacy))
    operators.start(namespace)
    completed_earlier(kubectl, namespace, "resting")
    kubectl(
        "apply", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(resource("Restore", "missing", checkpointRef={"name": "nowhere"})),
    )  # fmt: skip
    wait_for(
        lambda: "Failed" in kubectl("get", "restore", "missing", "-o", "jsonpath={.status.phase}").stdout,
        what="the Restore to fail",
    )
    policy = {"spec": {"deletionPolicy": "Delete"}}
    kubectl("patch", "checkpoint", "resting", "--type=merge", "-p", json.dumps(policy))
    wait_for(lambda: _metadata(kubectl, "resting").get("finalizers") == [finalizer_of()], what="the finalizer")
    kubectl("patch", "checkpoint", "resting", "--type=merge", "-p", json.dumps({"spec": {"deletionPolicy": "Retain"}}))
    wait_for(lambda: not _metadata(kubectl, "resting").get("finalizers"), what="the finalizer to go")
    restore = json.loads(kubectl("get", "restore", "missing", "-o", "json").stdout)["metadata"]
    assert not restore.get("finalizers")
    kubectl("delete", "checkpoint/resting", "restore/missing", "--timeout=10s", timeout=20)
    # the finalizer all releases once shared: taken off the release's own resources only
    wait_for(lambda: LEGACY_FINALIZER not in (_metadata(kubectl, "inherited").get("finalizers") or []), what="it")
    assert _metadata(kubectl, "anothers")["finalizers"] == [LEGACY_FINALIZER]
    kubectl("patch", "checkpoint", "anothers", "--type=merge", "-p", json.dumps({"metadata": {"finalizers": None}}))
