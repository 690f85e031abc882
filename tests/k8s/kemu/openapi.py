"""OpenAPI v3 documents, so clients validate as they do against a real cluster.

kube-apiserver serves `/openapi/v3` (an index of group-versions, each with a content hash) and
`/openapi/v3/apis/GROUP/VERSION` (paths and schemas). kubectl (and Helm, through the same client code)
first asks that document whether the kind's PATCH operation takes the `fieldValidation` query
parameter; if it does, client-side schema validation is skipped and the request goes out with
`fieldValidation=Strict`, so the server reports unknown fields (cli-runtime
query_param_verifier_v3.go). The emulator serves exactly that: every served resource's paths with
their GVK and the parameter, and for custom resources the CRD's schema, which `kubectl explain` reads.

PATCH operations list JSON patch, merge patch and apply patch bodies; without a strategic-merge body
kubectl builds the strategic merge patches of built-in kinds from its compiled-in types, as before.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp.web
import kmock

from . import errors

PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
PARAM_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "schema": {"type": "string", "uniqueItems": True},
    "description": "fieldValidation instructs the server on how to handle objects in the request "
    "(POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: Ignore, Warn "
    "(the default), Strict.",
}
PARAM_DRY_RUN = {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
PARAM_FIELD_MANAGER = {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
PARAM_FORCE = {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": True}}


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(group: str, version: str, kind: str) -> str:
    if not group:
        return f"io.k8s.api.core.{version}.{kind}"
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


def _operation(
    action: str, gvk: dict[str, str], ref: str, *, body: tuple[str, ...] = (), params: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": action,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}},
    }
    if params:
        op["parameters"] = list(params)
    if body:
        op["requestBody"] = {"content": {media: {"schema": {"$ref": ref}} for media in body}, "required": True}
    return op


def documents(
    resources: list[tuple[kmock.resource, kmock.ResourceInfo]], custom: dict[kmock.resource, Any]
) -> dict[str, dict[str, Any]]:
    """Every group-version's document, keyed by `api/v1`, `apis/apps/v1`, ..."""
    docs: dict[str, dict[str, Any]] = {}
    for res, info in resources:
        if (
            not isinstance(res.group, str)
            or not isinstance(res.version, str)
            or not isinstance(res.plural, str)
            or not info.kind
        ):
            continue
        group, version, plural, kind = res.group, res.version, res.plural, info.kind
        doc = docs.setdefault(
            gv_path(group, version),
            {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": "v1.36.0"},
                "paths": {},
                "components": {"schemas": {}},
            },
        )
        gvk = {"group": group, "version": version, "kind": kind}
        name = _schema_name(group, version, kind)
        ref = f"#/components/schemas/{name}"
        cr = custom.get(res)
        schema = dict(cr.schema) if cr is not None and cr.schema else {"type": "object"}
        schema["x-kubernetes-group-version-kind"] = [gvk]
        doc["components"]["schemas"][name] = schema
        prefix = f"/{gv_path(group, version)}" + ("/namespaces/{namespace}" if info.namespaced else "")
        write = (PARAM_DRY_RUN, PARAM_FIELD_MANAGER, PARAM_FIELD_VALIDATION)
        verbs = set(info.verbs)
        collection: dict[str, Any] = {}
        if "list" in verbs:
            collection["get"] = _operation("list", gvk, ref)
        if "create" in verbs:
            collection["post"] = _operation("post", gvk, ref, body=("application/json",), params=write)
        if collection:
            doc["paths"][f"{prefix}/{plural}"] = collection
        item: dict[str, Any] = {}
        if "get" in verbs:
            item["get"] = _operation("get", gvk, ref)
        if "update" in verbs:
            item["put"] = _operation("put", gvk, ref, body=("application/json",), params=write)
        if "patch" in verbs:
            item["patch"] = _operation("patch", gvk, ref, body=PATCH_TYPES, params=(*write, PARAM_FORCE))
        if "delete" in verbs:
            item["delete"] = _operation("delete", gvk, ref)
        if item:
            doc["paths"][f"{prefix}/{plural}/{{name}}"] = item
        for sub in sorted(info.subresources):
            if sub != "status":
                continue
            doc["paths"][f"{prefix}/{plural}/{{name}}/status"] = {
                "get": _operation("get", gvk, ref),
                "put": _operation("put", gvk, ref, body=("application/json",), params=write),
                "patch": _operation("patch", gvk, ref, body=PATCH_TYPES, params=(*write, PARAM_FORCE)),
            }
    return docs


def _hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()


def serve(raw: aiohttp.web.BaseRequest, docs: dict[str, dict[str, Any]]) -> aiohttp.web.StreamResponse:
    """`/openapi/v3` (the index) or `/openapi/v3/<gv>` (one document)."""
    path = raw.path.removeprefix("/openapi/v3").strip("/")
    if not path:
        index = {
            "paths": {
                gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={_hash(doc)}"} for gv, doc in sorted(docs.items())
            }
        }
        return aiohttp.web.json_response(index)
    doc = docs.get(path)
    if doc is None:
        return errors.resource_not_found().response()
    wanted = raw.query.get("hash")
    headers = {"Etag": f'"{_hash(doc)}"'}
    if wanted and wanted == _hash(doc):
        headers["Cache-Control"] = "public, immutable"
    elif wanted:
        # a stale hash: a real server redirects to the current one
        return aiohttp.web.HTTPFound(f"/openapi/v3/{path}?hash={_hash(doc)}")
    return aiohttp.web.json_response(doc, headers=headers)
