"""Strict validation of every kind the chart renders: Kubernetes' own kinds by kubernetes-validate, this project's
custom resources by their CRD's schema (unknown fields closed, as ``kubectl --validate=strict`` treats them), and
prometheus-operator's ServiceMonitor and PrometheusRule by a schema of the fields this chart sets, closed the same
way (their CRDs are not here; what is checked is what the chart writes, against the documented fields and types).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
K8S_VERSION = "1.33.0"
OWN_GROUP = "gym-checkpoint.dev/"


def strict(schema: Any) -> Any:
    """Close every object that lists its properties, unless it preserves unknown fields."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    """The validator of one of this project's kinds (``Checkpoint``, ``CheckpointStorageLocation``, ...)."""
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
            jsonschema.Draft7Validator.check_schema(schema)
            return jsonschema.Draft7Validator(schema)
    raise KeyError(f"no CRD of kind {kind} in {CRDS}")


_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
SERVICE_MONITOR = strict(
    {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": {**_META, "properties": {"name": {"type": "string"}, "labels": _LABELS}},
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "selector": {"type": "object", "properties": {"matchLabels": _LABELS}},
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["port"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string", "pattern": "^/"},
                                "interval": _DURATION,
                            },
                        },
                    },
                },
            },
        },
    }
)
PROMETHEUS_RULE = strict(
    {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": {**_META, "properties": {"name": {"type": "string"}, "labels": _LABELS}},
            "spec": {
                "type": "object",
                "required": ["groups"],
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "rules": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["alert", "expr"],
                                        "properties": {
                                            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                            "expr": {"type": "string", "minLength": 1},
                                            "for": _DURATION,
                                            "labels": _LABELS,
                                            "annotations": _LABELS,
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    }
)
MONITORING = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


@functools.cache
def _definitions(folder: str) -> Any:
    from kubernetes_validate import utils

    return utils.schema_contents(f"{folder}/_definitions.json", K8S_VERSION)


@functools.cache
def k8s_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict validator of one of Kubernetes' kinds at :data:`K8S_VERSION`, made once: what
    ``kubernetes_validate.validate(doc, K8S_VERSION, strict=True)`` builds at every call (the same schema files,
    registry and draft; kubernetes-validate is pinned in docker/requirements.lock), whose reading of the kind's
    schema and of the definitions file (megabytes of JSON) took most of the render tests' time."""
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    wanted = utils.major_minor(K8S_VERSION)
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= wanted][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # rbac.authorization.k8s.io/v1 -> rbac-v1
    schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group}.json", K8S_VERSION)
    registry = Resource.from_contents(_definitions(folder)) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(doc: dict[str, Any]) -> None:
    """Raise (a ``jsonschema.ValidationError``) when ``doc`` is not a valid object of its kind (module docstring)."""
    if doc["apiVersion"].startswith(OWN_GROUP):
        crd_validator(doc["kind"]).validate(doc)
    elif doc["kind"] in MONITORING:
        jsonschema.Draft7Validator(MONITORING[doc["kind"]]).validate(doc)
    else:
        k8s_validator(doc["apiVersion"], doc["kind"]).validate(doc)


# --- PromQL, as far as a test without Prometheus can honestly check it -------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<duration>\[[0-9]+(?:ms|s|m|h|d|w|y)\])
  | (?P<number>[0-9]+(?:\.[0-9]+)?)
  | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=(){},])
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    )""",
    re.VERBOSE,
)
AGGREGATIONS = {"sum", "max", "min", "avg", "count"}
FUNCTIONS = {"time", "increase", "rate", "histogram_quantile", "absent", "label_values"}
KEYWORDS = {"by", "without", "and", "or", "unless", "bool"}


def promql_shape(expr: str) -> list[str]:
    """The metric names an alert expression reads; AssertionError when it is not the shape of PromQL: a token
    PromQL does not have, brackets that do not balance, a function or aggregation PromQL does not know, a range
    selector not right after a selector, an aggregation's ``by`` without its label list."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        assert match and match.end() > pos, f"{expr!r}: cannot read {expr[pos : pos + 20]!r}"
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
    depth: list[str] = []
    metrics: list[str] = []
    for i, (kind, text) in enumerate(tokens):
        after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        before = tokens[i - 1][1] if i else ""
        if text in "({":
            depth.append(text)
        elif text in ")}":
            assert depth and depth.pop() == {")": "(", "}": "{"}[text], f"{expr!r}: unbalanced {text}"
        elif kind == "duration":
            assert before in ("}",) or tokens[i - 1][0] == "name", f"{expr!r}: a range must follow a selector"
        elif kind == "name" and depth[-1:] != ["{"] and not _in_by(tokens, i):
            if text in ("by", "without"):
                assert after == "(", f"{expr!r}: {text} needs its label list"
            elif after in ("by", "without"):
                assert text in AGGREGATIONS, f"{expr!r}: {text} is no aggregation"
            elif after == "(":
                assert text in AGGREGATIONS | FUNCTIONS, f"{expr!r}: PromQL has no function {text}"
            elif text not in KEYWORDS:
                metrics.append(text)
    assert not depth, f"{expr!r}: unclosed {depth}"
    return metrics


def _in_by(tokens: list[tuple[str, str]], i: int) -> bool:
    """Whether token ``i`` is inside a ``by (...)`` label list."""
    depth = 0
    for j in range(i, -1, -1):
        text = tokens[j][1]
        if text == ")":
            depth += 1
        elif text == "(":
            if depth == 0:
                return j > 0 and tokens[j - 1][1] in ("by", "without")
            depth -= 1
    return False
