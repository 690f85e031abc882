"""What the API server refuses before any operator sees it (the CRDs' rules): storage that a Checkpoint or Restore
names itself, and a change to a Checkpoint's spec but for ttl and deletionPolicy."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.operator.harness import (
    RELEASE,
    apply,
    checkpoint_doc,
    get,
    install_crds,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


@pytest.mark.parametrize(
    "kind, spec",
    [
        ("Checkpoint", {"storage": {"endpoint": "http://attacker.example:9000"}}),
        ("Checkpoint", {"storage": {"credentialsSecret": "team-s3"}}),
        ("Checkpoint", {"storage": {"location": "s3://other-bucket/x"}}),
        ("Restore", {"location": "s3://other-bucket/x", "checkpointId": "c"}),
        ("Restore", {"checkpointRef": {"name": "c"}, "storage": {"endpoint": "http://attacker.example:9000"}}),
    ],
)
def test_a_resource_naming_an_endpoint_credentials_or_a_url_is_refused_at_admission(kemu, kubectl, kind, spec) -> None:
    """Storage is the admin's. A Checkpoint or Restore that names an endpoint, credentials or a bucket of its own
    is refused by the API server (the CRD's rules), with a message naming spec.storageLocation;
    nothing is stored, so no operator ever sees it."""
    install_crds(kemu, kubectl)
    doc = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "redirect"},
        "spec": {"release": RELEASE, **spec},
    }
    refused = kubectl("apply", "-f", "-", check=False, input=yaml.safe_dump(doc))
    assert refused.returncode != 0 and "spec.storageLocation" in refused.stderr, refused.stderr
    assert kubectl("get", kind.lower(), "redirect", check=False).returncode != 0


def test_only_ttl_and_deletion_policy_of_a_checkpoint_may_change(kemu, kubectl) -> None:
    """Only ttl and deletionPolicy of a Checkpoint's spec may change (spec.method once could, although the docs
    said otherwise)."""
    install_crds(kemu, kubectl)
    apply(kubectl, checkpoint_doc("fixed", method="snapshot"))
    for change in ({"method": "sync"}, {"storageLocation": "other"}, {"release": "other"}, {"leaseSeconds": 90}):
        refused = kubectl(
            "patch", "checkpoint", "fixed", "--type=merge", "-p", json.dumps({"spec": change}), check=False
        )
        assert refused.returncode != 0 and "only spec.ttl and spec.deletionPolicy may change" in refused.stderr, change
    kubectl(
        "patch",
        "checkpoint",
        "fixed",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"ttl": "1h", "deletionPolicy": "Delete"}}),
    )
    assert get(kubectl, "checkpoint", "fixed")["spec"]["method"] == "snapshot"


@pytest.mark.parametrize(
    "selector, message",
    [
        ({"matchLabels": {"bad key!": "x"}}, "every matchLabels key must be a label key"),
        ({"matchLabels": {"a/b/c": "x"}}, "every matchLabels key must be a label key"),
        ({"matchLabels": {"tier": "not a value"}}, "spec.selector.matchLabels.tier"),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x y"]}]}, "matchExpressions[0].values[0]"),
        ({"matchExpressions": [{"key": "-tier", "operator": "Exists"}]}, "matchExpressions[0].key"),
    ],
)
def test_selector_label_keys_and_values_are_validated(kemu, kubectl, selector, message) -> None:
    """A selector's label keys and values are what Kubernetes accepts as labels (the CRD's schema and rules), so a
    typo is refused at once instead of a Checkpoint that matches no pod."""
    install_crds(kemu, kubectl)
    refused = kubectl("apply", "-f", "-", check=False, input=yaml.safe_dump(checkpoint_doc("typo", selector=selector)))
    assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    good = {"matchLabels": {"gym-checkpoint.dev/role": "agent", "tier": ""}}
    apply(kubectl, checkpoint_doc("fine", selector=good))


def test_kubectl_explain_describes_every_field(kemu, kubectl) -> None:
    """`kubectl explain` (the API server's OpenAPI document of the CRDs) says what a status field is."""
    install_crds(kemu, kubectl)
    explained = kubectl("explain", "checkpoint.status.blockers.participant").stdout
    assert "The participant that could not reach a boundary" in explained, explained
    explained = kubectl("explain", "restore.spec.selector.matchExpressions.operator").stdout
    assert "In and NotIn compare" in explained, explained
