"""values.schema.json: Helm refuses malformed values before rendering anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.k8s

helm = pytest.importorskip("helm_python")

SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "values.schema.json"


def server(**fields: Any) -> dict[str, Any]:
    return {"servers": [{"name": "srv", "server": "policy_model", "role": "model", **fields}]}


BAD_VALUES = {
    "unknown server": (server(server="not_a_server"), "/servers/0/server"),
    "participant without role": ({"servers": [{"name": "srv", "server": "policy_model"}]}, "missing property 'role'"),
    "unknown role": (server(role="backend"), "/servers/0/role"),
    "name not a DNS label": (server(name="Policy_Model"), "/servers/0/name"),
    "name too long": (server(name="a" * 24), "/servers/0/name"),
    "privileged port": (server(port=80), "/servers/0/port"),
    "unknown server key": (server(replicaCount=3), "replicaCount"),
    "no replicas": (server(replicas=0), "/servers/0/replicas"),
    "too many replicas": (server(replicas=65), "/servers/0/replicas"),
    "replicas not a number": (server(replicas="2"), "/servers/0/replicas"),
    "no servers": ({"servers": []}, "/servers"),
    "http storage location": ({"storage": {"location": "http://bucket/x"}}, "/storage/location"),
    "access key without secret key": ({"storage": {"s3": {"accessKeyId": "AKIA"}}}, "secretAccessKey"),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "short control token": ({"controlToken": {"value": "short"}}, "/controlToken/value"),
    "bad persistence size": ({"storage": {"embedded": {"persistence": {"size": "10GB"}}}}, "size"),
    "unknown top-level key": ({"replicaCount": 2}, "replicaCount"),
    "embedded flag not a bool": ({"storage": {"embedded": {"enabled": "yes"}}}, "/storage/embedded/enabled"),
    "storage location redefines default": (
        {"storage": {"locations": {"default": {"url": "s3://b/x"}}}},
        "/storage/locations",
    ),
    "storage location without url": (
        {"storage": {"locations": {"archive": {"endpoint": "https://s3.example"}}}},
        "url",
    ),
    "storage location name not a DNS label": (
        {"storage": {"locations": {"Archive": {"url": "s3://b/x"}}}},
        "/storage/locations",
    ),
    "storage location http url": (
        {"storage": {"locations": {"archive": {"url": "http://b/x"}}}},
        "/storage/locations/archive/url",
    ),
    "operator.credentialsSecrets is gone": ({"operator": {"credentialsSecrets": ["s"]}}, "credentialsSecrets"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_rejected(helm_chart: Any, case: str) -> None:
    values, where = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError) as caught:
        helm_chart.render(values, name="demo", namespace="prod")
    assert where in str(caught.value)


def test_good_values_pass(helm_chart: Any) -> None:
    helm_chart.validate_schema(
        {
            "servers": [{"name": "worker", "server": "inference_worker", "participant": False}],
            "controlToken": {"existingSecret": "my-token", "existingSecretKey": "tok"},
        }
    )


def test_schema_knows_every_server_gymckpt_serves() -> None:
    """A server added to gym_services.server.registry.SERVERS must be allowed by the chart too."""
    servers = pytest.importorskip("gym_services.server.registry")
    schema = json.loads(SCHEMA.read_text())
    allowed = set(schema["properties"]["servers"]["items"]["properties"]["server"]["enum"])
    assert set(servers.SERVERS) <= allowed
