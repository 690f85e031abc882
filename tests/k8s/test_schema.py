"""kemu enforces a custom resource's schema as kube-apiserver does: each test names the rule it checks.

The expected answers are kube-apiserver's own (messages from kube-openapi's validate package, mapped
to field errors by apiextensions-apiserver's `kubeOpenAPIResultToFieldErrors`; `Status` bodies from
`apierrors.NewInvalid`), checked against the sources of kubernetes/apiextensions-apiserver and
kube-openapi. A `Widget` CRD of the test's own exercises every keyword.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.k8s

GROUP = "kemu.test"
BASE = f"/apis/{GROUP}/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {
                    "rule": "self.replicas <= self.maxReplicas",
                    "message": "replicas may not exceed maxReplicas",
                    "fieldPath": ".replicas",
                },
                {
                    "rule": "!has(self.mode) || self.mode != 'frozen' || self.replicas == 0",
                    "messageExpression": "'a frozen widget runs no replicas, not ' + string(self.replicas)",
                },
                {"rule": "self.name.startsWith(self.prefix)", "reason": "FieldValueForbidden"},
            ],
            "properties": {
                "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                "maxReplicas": {"type": "integer", "format": "int32", "default": 5},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": True},
                "mode": {"type": "string", "enum": ["fast", "slow", "frozen"]},
                "name": {"type": "string", "minLength": 2, "maxLength": 8, "pattern": "^[a-z]+$", "default": "wid"},
                "prefix": {"type": "string", "default": "w"},
                "email": {"type": "string", "format": "email"},
                "when": {"type": "string", "format": "date-time"},
                "unchecked": {"type": "string", "format": "no-such-format"},
                "tags": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string"},
                    "x-kubernetes-list-type": "set",
                },
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                    },
                },
                "labels": {
                    "type": "object",
                    "maxProperties": 2,
                    "additionalProperties": {"type": "string", "maxLength": 5},
                },
                "note": {"type": "string", "nullable": True},
                "size": {"type": "integer"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "source": {
                    "type": "object",
                    "properties": {"url": {"type": "string"}, "path": {"type": "string"}, "inline": {"type": "string"}},
                    "oneOf": [{"required": ["url"]}, {"required": ["path"]}],
                },
                "target": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                    "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
                    "not": {"required": ["a", "b"]},
                },
                "owner": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "owner is immutable"}],
                },
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": ["Ready", "Failed"]},
                "count": {"type": "integer", "minimum": 0},
            },
        },
    },
}


BLOCKED = (
    "<nil>",
    "FieldValueInvalid",
    "Invalid value: null: some validation rules were not checked because the "
    "object was invalid; correct the existing errors to complete validation",
)


def crd(schema: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def widget(object_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": object_name}, "spec": spec}


@pytest.fixture(scope="module")
def api(kemu_shared: Any, kubectl_shared: Any) -> httpx.Client:
    kubectl_shared("apply", "-f", "-", input=yaml.safe_dump(crd()))
    with kemu_shared.client() as client:
        yield client


def create(api: httpx.Client, body: dict[str, Any], **params: str) -> httpx.Response:
    return api.post(BASE, json=body, params=params)


def causes(response: httpx.Response) -> list[tuple[str, str, str]]:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["status"] == "Failure"
    assert body["code"] == 422
    return [(c["field"], c["reason"], c["message"]) for c in body["details"]["causes"]]


def test_types_enums_and_int_formats(api: httpx.Client) -> None:
    """Type, enum and format errors (kube-openapi typeValidator/EnumFail): `Invalid value: "string": ... must be
    of type integer: "string"`, `Unsupported value: "x": supported values: ...`."""
    response = create(api, widget("types", replicas="three", mode="warp", ratio=True))
    assert causes(response) == [  # the apiserver's property order is its map's; kemu follows the schema
        (
            "spec.mode",
            "FieldValueNotSupported",
            'Unsupported value: "warp": supported values: "fast", "slow", "frozen"',
        ),
        (
            "spec.ratio",
            "FieldValueTypeInvalid",
            'Invalid value: "boolean": spec.ratio in body must be of type number: "boolean"',
        ),
        (
            "spec.replicas",
            "FieldValueTypeInvalid",
            'Invalid value: "string": spec.replicas in body must be of type integer: "string"',
        ),
        BLOCKED,
    ]
    body = response.json()
    assert body["message"].startswith('Widget.kemu.test "types" is invalid: [')
    assert body["details"] | {"causes": None} == {"name": "types", "group": GROUP, "kind": "Widget", "causes": None}
    assert (
        create(api, widget("int32", maxReplicas=2**31)).json()["details"]["causes"][0]["message"]
        == 'Invalid value: "": Checked value must be of type integer with format int32 in spec.maxReplicas'
    )


def test_patterns_lengths_and_string_formats(api: httpx.Client) -> None:
    """String validators run maxLength, minLength, pattern and stop at the first failure; formats CRDs may use are
    checked (`email`, `date-time`), unknown ones are ignored (StripUnsupportedFormatsPostProcessor)."""
    found = causes(create(api, widget("strings", name="Bad1", email="nobody", when="yesterday", unchecked="any")))
    assert found == [
        (
            "spec.email",
            "FieldValueTypeInvalid",
            'Invalid value: "nobody": spec.email in body must be of type email: "nobody"',
        ),
        ("spec.name", "FieldValueInvalid", "Invalid value: \"Bad1\": spec.name in body should match '^[a-z]+$'"),
        (
            "spec.when",
            "FieldValueTypeInvalid",
            'Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday"',
        ),
        BLOCKED,
    ]
    assert causes(create(api, widget("long", name="abcdefghijk"))) == [
        ("spec.name", "FieldValueTooLong", "Too long: may not be more than 8 bytes"),
        BLOCKED,
    ]
    assert causes(create(api, widget("short", name="a", prefix="a"))) == [
        ("spec.name", "FieldValueInvalid", 'Invalid value: "a": spec.name in body should be at least 2 chars long')
    ]
    assert create(api, widget("fine", email="a@b.c", when="2026-01-02T03:04:05Z", unchecked="x")).status_code == 201


def test_numeric_bounds_items_and_properties(api: httpx.Client) -> None:
    """minimum/maximum (inclusive and exclusive), minItems/maxItems, maxProperties and additionalProperties schemas."""
    found = causes(
        create(api, widget("bounds", replicas=11, ratio=1.0, tags=[], labels={"a": "x", "b": "y", "c": "z"}))
    )
    assert (
        "spec.replicas",
        "FieldValueInvalid",
        "Invalid value: 11: spec.replicas in body should be less than or equal to 10",
    ) in found
    assert ("spec.ratio", "FieldValueInvalid", "Invalid value: 1: spec.ratio in body should be less than 1") in found
    assert (
        "spec.tags",
        "FieldValueInvalid",
        "Invalid value: 0: spec.tags in body should have at least 1 items",
    ) in found
    assert ("spec.labels", "FieldValueTooMany", "Too many: 3: must have at most 2 items") in found
    found = causes(create(api, widget("items", replicas=-1, tags=["a", "b", "c", "d"], labels={"k": "toolong"})))
    assert (
        "spec.replicas",
        "FieldValueInvalid",
        "Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
    ) in found
    assert ("spec.tags", "FieldValueTooMany", "Too many: 4: must have at most 3 items") in found
    assert ("spec.labels.k", "FieldValueTooLong", "Too long: may not be more than 5 bytes") in found


def test_required_one_of_any_of_and_not(api: httpx.Client) -> None:
    """`required` gives `Required value`; oneOf/anyOf/not failures are not field-scoped (`<nil>`), followed by
    the failures of the alternative that matched most."""
    missing = api.post(BASE, json={"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "nospec"}})
    assert causes(missing)[0] == ("spec", "FieldValueRequired", "Required value")
    found = causes(create(api, widget("oneof", source={"inline": "x"})))
    assert found[:2] == [
        (
            "<nil>",
            "FieldValueInvalid",
            'Invalid value: "": "spec.source" must validate one and only one schema (oneOf). Found none valid',
        ),
        ("spec.source.url", "FieldValueRequired", "Required value"),
    ]
    both = causes(create(api, widget("both", source={"url": "u", "path": "p"})))
    assert both == [
        (
            "<nil>",
            "FieldValueInvalid",
            'Invalid value: "": "spec.source" must validate one and only one '
            "schema (oneOf). Found 2 valid alternatives",
        )
    ]
    assert causes(create(api, widget("anyof", target={})))[0] == (
        "<nil>",
        "FieldValueInvalid",
        'Invalid value: "": "spec.target" must validate at least one schema (anyOf)',
    )
    assert causes(create(api, widget("not", target={"a": "1", "b": "2"}))) == [
        ("<nil>", "FieldValueInvalid", 'Invalid value: "": "spec.target" must not validate the schema (not)')
    ]
    assert create(api, widget("good", source={"path": "p"}, target={"b": "2"})).status_code == 201


def test_nulls_nullable_and_pruned(api: httpx.Client) -> None:
    """A null in a non-nullable field without default is dropped (PruneNonNullableNullsWithoutDefaults); a
    nullable field keeps it; a non-nullable field with a default gets the default."""
    created = create(api, widget("nulls", note=None, size=None, replicas=None))
    assert created.status_code == 201, created.text
    spec = created.json()["spec"]
    assert spec["note"] is None and "size" not in spec and spec["replicas"] == 1


def test_list_type_set_and_map_uniqueness(api: httpx.Client) -> None:
    """x-kubernetes-list-type set items and map keys must be unique (listtype.ValidateListSetsAndMaps)."""
    found = causes(
        create(
            api, widget("lists", tags=["a", "a"], ports=[{"name": "http", "port": 80}, {"name": "http", "port": 81}])
        )
    )
    assert ("spec.tags[1]", "FieldValueDuplicate", 'Duplicate value: "a"') in found
    assert ("spec.ports[1]", "FieldValueDuplicate", 'Duplicate value: {"name":"http"}') in found


def test_cel_rules_message_message_expression_field_path_and_reason(api: httpx.Client) -> None:
    """x-kubernetes-validations: `message`, `messageExpression`, `fieldPath` and `reason`; the value is omitted
    for object-typed nodes; a failing rule without message reports `failed rule: <rule>`."""
    found = causes(create(api, widget("cel", replicas=7, maxReplicas=3, mode="frozen", name="abc", prefix="x")))
    assert found == [
        ("spec.replicas", "FieldValueInvalid", "Invalid value: replicas may not exceed maxReplicas"),
        ("spec", "FieldValueInvalid", "Invalid value: a frozen widget runs no replicas, not 7"),
        ("spec", "FieldValueForbidden", "Forbidden: failed rule: self.name.startsWith(self.prefix)"),
    ]
    assert create(api, widget("celok", replicas=0, mode="frozen")).status_code == 201


def test_cel_transition_rule_sees_old_self_and_updates_ratchet(api: httpx.Client) -> None:
    """A rule naming oldSelf runs only on updates (transition rule); other rules on unchanged values are not
    re-enforced on update: CRDValidationRatcheting, GA in Kubernetes 1.33."""
    assert create(api, widget("owned", owner="alice")).status_code == 201
    url = f"{BASE}/owned"
    changed = api.patch(url, headers=MERGE, content=json.dumps({"spec": {"owner": "bob"}}))
    assert causes(changed) == [("spec.owner", "FieldValueInvalid", 'Invalid value: "bob": owner is immutable')]
    same = api.patch(url, headers=MERGE, content=json.dumps({"spec": {"owner": "alice", "replicas": 2}}))
    assert same.status_code == 200 and same.json()["metadata"]["generation"] == 2


def test_cel_rules_are_not_run_on_a_schema_invalid_object(api: httpx.Client) -> None:
    """Required, Unsupported, Too long, Too many and type errors block the CEL rules (hasBlockingErr)."""
    found = causes(create(api, widget("blocked", mode="warp", replicas=9, maxReplicas=1)))
    assert [f for f, _, _ in found] == ["spec.mode", "<nil>"]
    assert "some validation rules were not checked" in found[1][2]


def test_unknown_fields_are_pruned_unless_preserved(api: httpx.Client) -> None:
    """Fields the structural schema does not declare are dropped (pruning), at any depth and in metadata;
    `x-kubernetes-preserve-unknown-fields` keeps them."""
    body = widget("pruned", extra={"anything": {"goes": [1, 2]}}, bogus=1, ports=[{"name": "a", "junk": True}])
    body["metadata"]["surprise"] = "x"
    body["topLevel"] = {"a": 1}
    created = create(api, body)
    assert created.status_code == 201, created.text
    obj = created.json()
    assert "bogus" not in obj["spec"] and obj["spec"]["ports"] == [{"name": "a"}] and "topLevel" not in obj
    assert obj["spec"]["extra"] == {"anything": {"goes": [1, 2]}} and "surprise" not in obj["metadata"]
    warnings = created.headers.get_list("warning")
    assert warnings == [
        '299 - "unknown field \\"metadata.surprise\\""',
        '299 - "unknown field \\"spec.bogus\\""',
        '299 - "unknown field \\"spec.ports[0].junk\\""',
        '299 - "unknown field \\"topLevel\\""',
    ]


def test_field_validation_strict_warn_and_ignore(api: httpx.Client) -> None:
    """fieldValidation=Strict refuses unknown fields (create/update: 400 `strict decoding error`, patch: 422 on
    `patch`, server-side apply: `field not declared in schema`), Warn (the default) warns, Ignore is silent."""
    strict = create(api, widget("strict", bogus=1), fieldValidation="Strict")
    assert strict.status_code == 400 and strict.json()["reason"] == "BadRequest"
    assert strict.json()["message"] == (
        'Widget in version "v1" cannot be handled as a Widget: strict decoding error: unknown field "spec.bogus"'
    )
    ignored = create(api, widget("ignored", bogus=1), fieldValidation="Ignore")
    assert ignored.status_code == 201 and not ignored.headers.get_list("warning")
    patch = api.patch(
        f"{BASE}/ignored", params={"fieldValidation": "Strict"}, headers=MERGE, content=json.dumps({"spec": {"zzz": 1}})
    )
    assert patch.status_code == 422
    cause = patch.json()["details"]["causes"][0]
    assert cause["field"] == "patch" and cause["message"].endswith('strict decoding error: unknown field "spec.zzz"')
    assert patch.json()["message"].startswith(' "" is invalid: patch: Invalid value: "{')
    apply = api.patch(
        f"{BASE}/ignored",
        params={"fieldManager": "t", "fieldValidation": "Strict"},
        headers={"Content-Type": "application/apply-patch+yaml"},
        content=json.dumps(widget("ignored", zzz=1)),
    )
    assert apply.status_code == 500
    assert apply.json()["message"] == (
        "failed to create typed patch object (default/ignored; kemu.test/v1, "
        "Kind=Widget): .spec.zzz: field not declared in schema"
    )
    bad = create(api, widget("badmode"), fieldValidation="Loose")
    assert bad.status_code == 422 and 'supported values: "Ignore", "Warn", "Strict"' in bad.json()["message"]


def test_defaults_apply_on_create_update_and_read(kemu: Any, kubectl: Any) -> None:
    """`default:` values are applied when a body is decoded (create, update, patch) and when an object is read
    back from storage, so a default added to the CRD later shows on existing objects (structural defaulting).
    Without the default, the rule reading `self.replicas` fails to evaluate (`no such key`)."""
    without = copy.deepcopy(SCHEMA)
    del without["properties"]["spec"]["properties"]["replicas"]["default"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(crd(without)))
    with kemu.client() as client:
        assert causes(client.post(BASE, json=widget("dflt"))) == [
            (
                "spec",
                "FieldValueInvalid",
                'Invalid value: "object": no such key: replicas evaluating rule: replicas may not exceed maxReplicas',
            )
        ]
        del without["properties"]["spec"]["x-kubernetes-validations"]
        kubectl("apply", "-f", "-", input=yaml.safe_dump(crd(without)))
        created = client.post(BASE, json=widget("dflt"))
        assert created.status_code == 201, created.text
        assert "replicas" not in created.json()["spec"] and created.json()["spec"]["name"] == "wid"
        kubectl("apply", "-f", "-", input=yaml.safe_dump(crd()))
        assert client.get(f"{BASE}/dflt").json()["spec"]["replicas"] == 1
        listed = client.get(BASE).json()["items"]
        assert listed[0]["spec"]["replicas"] == 1
        cleared = client.patch(f"{BASE}/dflt", headers=MERGE, content=json.dumps({"spec": {"replicas": None}}))
        assert cleared.json()["spec"]["replicas"] == 1


def test_metadata_is_validated_like_object_meta(api: httpx.Client) -> None:
    """ValidateObjectMeta: the name is a DNS-1123 subdomain, label keys and values are checked."""
    found = causes(create(api, {**widget("Bad_Name"), "metadata": {"name": "Bad_Name", "labels": {"ok": "no way"}}}))
    assert found[0][0] == "metadata.name" and "a lowercase RFC 1123 subdomain must consist of" in found[0][2]
    assert found[1][0] == "metadata.labels" and "a valid label must be an empty string" in found[1][2]
    nameless = api.post(BASE, json={"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {}, "spec": {}})
    assert causes(nameless) == [
        ("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")
    ]


def test_status_writes_validate_status_and_main_writes_ignore_it(api: httpx.Client) -> None:
    """With the status subresource, writes to the resource ignore .status and writes to /status change only
    .status and are validated against the status schema; generation counts spec changes only."""
    assert create(api, widget("st")).status_code == 201
    url = f"{BASE}/st"
    bad = api.patch(f"{url}/status", headers=MERGE, content=json.dumps({"status": {"phase": "Sleeping"}}))
    assert causes(bad)[0] == (
        "status.phase",
        "FieldValueNotSupported",
        'Unsupported value: "Sleeping": supported values: "Ready", "Failed"',
    )
    ok = api.patch(
        f"{url}/status",
        headers=MERGE,
        content=json.dumps({"status": {"phase": "Ready", "count": 1, "extra": 1}, "spec": {"replicas": 3}}),
    )
    assert ok.status_code == 200
    assert ok.json()["status"] == {"phase": "Ready", "count": 1} and ok.json()["spec"]["replicas"] == 1
    assert ok.json()["metadata"]["generation"] == 1
    main = api.patch(
        url, headers=MERGE, content=json.dumps({"status": {"phase": "Failed"}, "metadata": {"labels": {"a": "b"}}})
    )
    assert main.json()["status"]["phase"] == "Ready" and main.json()["metadata"]["generation"] == 1
    spec = api.patch(url, headers=MERGE, content=json.dumps({"spec": {"replicas": 2}}))
    assert spec.json()["metadata"]["generation"] == 2


def test_resource_version_conflicts_and_unconditional_updates(api: httpx.Client) -> None:
    """A stale resourceVersion on PUT or PATCH is a 409 Conflict; custom resources refuse a PUT without one
    (AllowUnconditionalUpdate is false: `metadata.resourceVersion: Invalid value: 0: must be specified`)."""
    first = create(api, widget("rv")).json()
    url = f"{BASE}/rv"
    assert int(first["metadata"]["resourceVersion"]) > 0 and first["metadata"]["uid"]
    assert first["metadata"]["creationTimestamp"].endswith("Z")
    second = api.patch(url, headers=MERGE, content=json.dumps({"spec": {"replicas": 2}})).json()
    assert second["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    stale_put = api.put(url, json=first)
    assert stale_put.status_code == 409 and stale_put.json()["reason"] == "Conflict"
    assert stale_put.json()["message"] == (
        'Operation cannot be fulfilled on widgets.kemu.test "rv": the object has '
        "been modified; please apply your changes to the latest version and try "
        "again"
    )
    stale_patch = api.patch(
        url,
        headers=MERGE,
        content=json.dumps(
            {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, "spec": {"replicas": 3}}
        ),
    )
    assert stale_patch.status_code == 409
    unconditional = copy.deepcopy(second)
    del unconditional["metadata"]["resourceVersion"]
    refused = api.put(url, json=unconditional)
    assert refused.status_code == 422
    assert refused.json()["message"] == (
        'widgets.kemu.test "rv" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update'
    )
    assert api.put(url, json=second).status_code == 200


def test_crd_with_a_rule_that_does_not_compile_is_refused(api: httpx.Client) -> None:
    """CRD validation compiles every x-kubernetes-validations rule; a broken one makes the CRD Invalid."""
    broken = copy.deepcopy(crd())
    broken["metadata"]["name"] = f"gadgets.{GROUP}"
    broken["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"}
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] = [
        {"rule": "self.replicas <"}
    ]
    response = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=broken)
    assert response.status_code == 422
    cause = response.json()["details"]["causes"][0]
    assert cause["field"] == (
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    )
    assert "compilation failed" in cause["message"]
    assert api.get(f"/apis/{GROUP}/v1/namespaces/default/gadgets").status_code == 404


def test_kubectl_validates_with_the_servers_schema(api: httpx.Client, kubectl_shared: Any) -> None:
    """kubectl finds `fieldValidation` in the OpenAPI v3 document and sends Strict: an unknown field fails the
    apply; `--validate=warn` applies it with a warning; `kubectl explain` reads the CRD's schema."""
    manifest = yaml.safe_dump(widget("viakubectl", bogus=1))
    refused = kubectl_shared("apply", "-f", "-", input=manifest, check=False)
    assert refused.returncode != 0 and 'unknown field "spec.bogus"' in refused.stderr, refused.stderr
    warned = kubectl_shared("apply", "--validate=warn", "-f", "-", input=manifest)
    assert 'unknown field "spec.bogus"' in warned.stderr
    invalid = kubectl_shared("apply", "-f", "-", input=yaml.safe_dump(widget("viakubectl2", replicas=99)), check=False)
    assert (
        "spec.replicas: Invalid value: 99: spec.replicas in body should be less than or equal to 10" in invalid.stderr
    )
    explained = kubectl_shared("explain", "widgets.spec.mode")
    assert "mode" in explained.stdout and "string" in explained.stdout
