"""What a release renders that must not clash with another release or a GitOps tool: object names of long release
names (distinct, with a hash), and labels on what the chart's hooks create at run time (never the label Argo CD 2.x
tracks its own objects by)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tests.chart import schemas

pytestmark = pytest.mark.k8s

pytest.importorskip("kubernetes_validate")

#: every template on (the hooks, the operator's PDB, monitoring, a second storage location): all the names a release has
EVERYTHING = {
    "operator": {"replicas": 2},
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
    "storage": {"locations": {"archive": {"url": "s3://old-cluster/gym", "existingSecret": "archive-s3"}}},
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs}


def test_release_names_over_28_characters_sharing_a_prefix_render_distinct_names(render: Any) -> None:
    """Two releases whose names share their first 30 characters (in one namespace, or cluster-wide for the
    ClusterRoles): no object name in common - the Kubernetes Lease, the generated Secret, the StatefulSets, the hooks'
    objects - where truncation to 28 characters once gave both the same 42 names and the second install failed with
    an ownership error. Names stay DNS labels (a pod is <fullname>-<server>-0) and validate strictly; a release name
    of 28 characters or fewer renders what it always did."""
    first, second = "research-team-alpha-rollouts-2026-a", "research-team-alpha-rollouts-2026-b"
    a, b = render(EVERYTHING, name=first), render(EVERYTHING, name=second)
    assert not names(a) & names(b), sorted(names(a) & names(b))
    for doc in a:
        name = doc["metadata"]["name"]
        assert len(name) <= 63 and DNS_LABEL.match(name), name
        schemas.validate(doc)  # (this project's kinds by their CRD, Kubernetes' strictly)
    statefulsets = [d["metadata"]["name"] for d in a if d["kind"] == "StatefulSet"]
    assert all(len(f"{name}-0") <= 63 for name in statefulsets)
    env = {
        e["name"]: e.get("value")
        for d in a
        if d["kind"] == "Deployment"
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["GYMCKPT_RELEASE"] == first  # the release itself is never shortened
    assert env["GYMCKPT_LEADER_LEASE"].startswith("research-team-alpha-") and len(env["GYMCKPT_LEADER_LEASE"]) <= 37
    # unchanged for the names that always fitted (an upgrade renames nothing)
    assert ("Deployment", "rl-training-prod-gym-checkpo-operator") in names(render(name="rl-training-prod"))
    assert ("Deployment", "demo-gym-checkpoint-operator") in names(render())


def test_what_the_hooks_create_carries_no_label_argo_cd_prunes_by(render: Any) -> None:
    """Argo CD 2.x tracks its application's objects by `app.kubernetes.io/instance=<release>`: an object carrying it
    that Argo CD did not render is extraneous, and with prune on it is deleted - the generated Secret (the tokens
    rotate) or a hook's Checkpoint. The objects the hooks create at run time carry `gym-checkpoint.dev/release`
    instead (docs/operations/guide.md, "Argo CD")."""
    docs = render(EVERYTHING)
    commands = [d["spec"]["template"]["spec"]["containers"][0]["command"] for d in docs if d["kind"] == "Job"]
    assert commands
    labels = [c[i + 1] for c in commands for i, arg in enumerate(c) if arg == "--label"]
    assert not [label for label in labels if label.startswith("app.kubernetes.io/instance")], labels
    assert "gym-checkpoint.dev/release=demo" in labels
    secrets = next(c for c in commands if c[:3] == ["gymckpt", "cluster", "secret"] and "--delete" not in c)
    assert "gym-checkpoint.dev/release=demo" in [secrets[i + 1] for i, a in enumerate(secrets) if a == "--label"]
