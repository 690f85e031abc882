"""The CustomResourceDefinitions: valid CRD manifests, and schemas that accept good and reject bad resources.

kube-apiserver validates custom resources against `openAPIV3Schema` and, with kubectl's default
`--validate=strict` field validation, rejects unknown fields. Here the same schema is checked with
jsonschema, unknown fields closed off the way strict field validation treats them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tests.chart.schemas import strict

pytestmark = pytest.mark.k8s

kubernetes_validate = pytest.importorskip("kubernetes_validate")

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
API = "gym-checkpoint.dev/v1alpha1"


def load_crd(name: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / f"{name}.yaml").read_text())


def validator(kind: str) -> jsonschema.Draft7Validator:
    crd = load_crd(kind)
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def resource(kind: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A resource of release demo (spec.release is required) unless ``spec`` names one."""
    spec = {"release": "demo", **spec}
    body: dict[str, Any] = {"apiVersion": API, "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    if status is not None:
        body["status"] = status
    return body


FULL_STATUS = {
    "phase": "Completed",
    "observedGeneration": 1,
    "checkpointId": "20261129T195800Z-3f2a",
    "location": "s3://gym-checkpoints/demo",
    "participantCount": 2,
    "participants": [
        {"id": "demo-gym-checkpoint-policy-model-0", "role": "model", "records": 3, "bytes": 4096},
        {"id": "demo-gym-checkpoint-simple-agent-0", "role": "agent", "records": 3, "bytes": 2048},
    ],
    "blockers": [
        {
            "participant": "demo-gym-checkpoint-workplace-assistant-0",
            "kind": "tool_call",
            "id": "r-7",
            "detail": "still running at the deadline",
        }
    ],
    "timings": {"prepare": 0.12, "commit": 0.3, "publish": 0.01, "resume": 0.02},
    "pauseSeconds": 0.45,
    "bytes": 6144,
    "attempt": 1,
    "restoredEpisodes": 0,
    "reason": "Completed",
    "message": "checkpoint published",
    "startTime": "2026-11-29T19:58:00Z",
    "completionTime": "2026-11-29T19:58:01Z",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Published",
            "message": "manifest written",
            "lastTransitionTime": "2026-11-29T19:58:01Z",
            "observedGeneration": 1,
        }
    ],
    "kopf": {"progress": {"anything": "goes"}},
}

GOOD_CHECKPOINTS = {
    "empty spec": {},
    "full spec": {
        "selector": {
            "matchLabels": {"app.kubernetes.io/instance": "demo", "tier": ""},
            "matchExpressions": [{"key": "gym-checkpoint.dev/role", "operator": "In", "values": ["agent", "model"]}],
        },
        "storageLocation": "archive",
        "prepareTimeoutSeconds": 300,
        "leaseSeconds": 60,
    },
    "default location": {"storageLocation": "default"},
}
BAD_CHECKPOINTS = {
    "timeout zero": {"prepareTimeoutSeconds": 0},
    "timeout too long": {"prepareTimeoutSeconds": 3601},
    "timeout as string": {"prepareTimeoutSeconds": "30"},
    "lease too short": {"leaseSeconds": 4},
    "location not a name": {"storageLocation": "s3://bucket/prefix"},
    "location with capitals": {"storageLocation": "Archive"},
    "label value not a string": {"selector": {"matchLabels": {"a": 1}}},
    "label value not a label value": {"selector": {"matchLabels": {"a": "two words"}}},
    "expression key not a label key": {"selector": {"matchExpressions": [{"key": "-bad", "operator": "Exists"}]}},
    "expression value not a label value": {
        "selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a/b"]}]}
    },
    "unknown field": {"prepareTimeout": 30},
    "release not a DNS label": {"release": "Demo_1"},
}
GOOD_RESTORES = {
    "by name": {"checkpointRef": {"name": "ckpt-1"}},
    "by location": {"storageLocation": "archive", "checkpointId": "20261129T195800Z-3f2a", "leaseSeconds": 120},
    "by id in the default location": {"checkpointId": "20261129T195800Z-3f2a"},
}
BAD_RESTORES = {
    "neither": {},
    "location not a name": {"storageLocation": "s3://gym-checkpoints/demo", "checkpointId": "a"},
    "ref without name": {"checkpointRef": {}},
    "bad id": {"checkpointId": "../escape"},
    "lease too long": {"checkpointRef": {"name": "c"}, "leaseSeconds": 7200},
    "empty release": {"checkpointRef": {"name": "c"}, "release": ""},
}


@pytest.mark.parametrize("name", ["checkpoints", "restores"])
def test_crd_manifests_validate_against_the_apiextensions_schema(name: str) -> None:
    crd = load_crd(name)
    kubernetes_validate.validate(crd, "1.33.0", strict=True)
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["group"] == "gym-checkpoint.dev"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_names_and_printer_columns() -> None:
    checkpoints, restores = load_crd("checkpoints"), load_crd("restores")
    assert checkpoints["spec"]["names"]["shortNames"] == ["gckpt"]
    assert restores["spec"]["names"]["shortNames"] == ["grestore"]

    def default_columns(crd: dict[str, Any]) -> list[str]:
        return [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]

    assert default_columns(checkpoints) == ["Release", "Phase", "Participants", "Pause", "Age"]
    assert default_columns(restores) == ["Release", "Phase", "Checkpoint", "Attempt", "Age"]


@pytest.mark.parametrize("case", sorted(GOOD_CHECKPOINTS))
def test_good_checkpoints_pass(case: str) -> None:
    validator("checkpoints").validate(resource("Checkpoint", GOOD_CHECKPOINTS[case], FULL_STATUS))


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_malformed_checkpoints_are_rejected(case: str) -> None:
    assert not validator("checkpoints").is_valid(resource("Checkpoint", BAD_CHECKPOINTS[case]))


@pytest.mark.parametrize("case", sorted(GOOD_RESTORES))
def test_good_restores_pass(case: str) -> None:
    status = dict(FULL_STATUS, phase="Restoring", restoredEpisodes=12, attempt=2)
    validator("restores").validate(resource("Restore", GOOD_RESTORES[case], status))


@pytest.mark.parametrize("case", sorted(BAD_RESTORES))
def test_malformed_restores_are_rejected(case: str) -> None:
    assert not validator("restores").is_valid(resource("Restore", BAD_RESTORES[case]))


@pytest.mark.parametrize("kind", ["checkpoints", "restores"])
@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Running"},
        {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Maybe",
                    "reason": "X",
                    "message": "",
                    "lastTransitionTime": "2026-11-29T19:58:01Z",
                }
            ]
        },
        {"participants": [{"id": "p", "role": "backend"}]},
        {"timings": {"prepare": -1}},
        {"blockers": [{"participant": "p"}]},
    ],
)
def test_malformed_status_is_rejected(kind: str, change: dict[str, Any]) -> None:
    status = copy.deepcopy(FULL_STATUS)
    status.update(change)
    spec = {"checkpointRef": {"name": "c"}} if kind == "restores" else {}
    assert not validator(kind).is_valid(resource(kind[:-1].capitalize(), spec, status))


def test_a_spec_is_required() -> None:
    body = resource("Checkpoint", {})
    del body["spec"]
    assert not validator("checkpoints").is_valid(body)


@pytest.mark.parametrize("kind", ["checkpoints", "restores"])
def test_a_release_is_required(kind: str) -> None:
    """The release's operator runs it, the others ignore it: a resource naming no release would run nowhere."""
    spec = {"checkpointRef": {"name": "c"}} if kind == "restores" else {}
    body = resource(kind[:-1].capitalize(), spec)
    del body["spec"]["release"]
    errors = list(validator(kind).iter_errors(body))
    assert any("'release' is a required property" in e.message for e in errors), errors


def undescribed(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every field of a schema without a description (what `kubectl explain` would show empty)."""
    found = []
    for name, child in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        if not child.get("description"):
            found.append(here)
        found += undescribed(child, here)
    if isinstance(schema.get("items"), dict):
        found += undescribed(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += undescribed(schema["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("name", sorted(path.stem for path in CRDS.glob("*.yaml")))
def test_every_field_is_described(name: str) -> None:
    """`kubectl explain checkpoint.status.blockers` says what each field is: no field of any of the chart's CRDs lacks
    a description (43 of the Checkpoint's and 42 of the Restore's once did)."""
    schema = load_crd(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert undescribed(schema) == []
    assert undescribed({"properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}) == [
        ".a",
        ".a.b",
    ]  # (the count itself finds what lacks one)
