"""The chart's CRDs applied before ``helm upgrade`` replaces the operator (``gym-operator --apply-crds DIR``: the
chart's pre-upgrade hook, ``crds.upgrade``, as Velero's chart's ``upgradeCRDs``).

Helm installs a chart's ``crds/`` at the first install and never again, so an upgrade whose operator reads a new spec
field would run over the old schema (the API server prunes the field: :mod:`gym_operator.crdcheck` refuses to lead
then). This hook gets the chart's CRDs in a ConfigMap and creates or replaces each in the cluster, so the new
operator pods find their schema. It never replaces an installed CRD by an older one (a lower
``gym-checkpoint.dev/schema-version``: a chart rolled back over newer CRDs): the older operator reads a subset of
the newer schema, and replacing it would prune fields other resources still hold. Exit 0 when every CRD is current, 1
when one could not be applied (the upgrade then stops before anything else changes).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gym_operator.kube import api_client

log = logging.getLogger("gym.operator.crds")

#: the annotation every CRD of the chart carries, bumped with each schema change (tests/chart/test_crd_versions.py)
SCHEMA_VERSION = "gym-checkpoint.dev/schema-version"


def _version(crd: dict[str, Any]) -> int:
    raw = ((crd.get("metadata") or {}).get("annotations") or {}).get(SCHEMA_VERSION)
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return 0


def _typed(manifest: dict[str, Any]) -> client.V1CustomResourceDefinition:
    """The manifest as the client sends it (it serializes a mapping as it is; the stubs name the model class)."""
    return cast(client.V1CustomResourceDefinition, manifest)


def read(directory: Path) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in the YAML files of ``directory`` (a mounted ConfigMap: its keys are files)."""
    found = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                found.append(doc)
    return found


def apply_one(api: client.ApiextensionsV1Api, crd: dict[str, Any]) -> str:
    """Create or replace one CRD (never by an older schema-version); what happened, in a line."""
    name = crd["metadata"]["name"]
    try:
        installed = api.read_custom_resource_definition(name, _request_timeout=30)
    except ApiException as exc:
        if exc.status != 404:
            raise
        api.create_custom_resource_definition(_typed(crd), _request_timeout=30)
        return f"{name}: created (schema-version {_version(crd)})"
    have = _version(api.api_client.sanitize_for_serialization(installed))
    want = _version(crd)
    if have > want:
        return f"{name}: kept (installed schema-version {have} is newer than the chart's {want})"
    version = installed.metadata.resource_version if installed.metadata else None
    body = {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}}
    api.replace_custom_resource_definition(name, _typed(body), _request_timeout=30)
    return f"{name}: {'replaced' if have != want else 'applied again'} (schema-version {have} -> {want})"


def run(directory: Path) -> int:
    crds = read(directory)
    if not crds:
        log.error(f"no CustomResourceDefinition in {directory}: nothing applied")
        return 1
    api = client.ApiextensionsV1Api(api_client())
    failed = False
    for crd in crds:
        try:
            print(apply_one(api, crd), flush=True)
        except ApiException as exc:
            log.error(f"{crd['metadata']['name']}: could not be applied: {exc.status} {exc.reason}: {exc.body}")
            failed = True
    return 1 if failed else 0
