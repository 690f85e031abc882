"""A thin async wrapper over the Kubernetes Python client: the few calls the operator makes.

Built once at startup by :mod:`gym_operator.handlers` and used by the controllers (:mod:`gym_operator.controllers`,
through their shared context). Every call it makes is one the chart's operator Role grants
(``charts/gym-checkpoint/templates/operator.yaml``; kopf's own calls, and the leadership's on its Kubernetes Lease
(:mod:`gym_operator.leadership`), are listed there too): list pods and StatefulSets; get, list, create and delete
Checkpoints (create: a schedule's, a termination's, the catalog sync's); list and create Restores (the automatic
resume); get and list CheckpointStorageLocations; patch the status of Checkpoints, Restores, CheckpointSchedules and
CheckpointStorageLocations; create Events; get the Secrets of the storage locations (by name); at
shutdown, get its own Namespace and Deployment and patch the finalizers off its resources when the release is going
away.

Errors come out as :class:`Unavailable` (worth retrying: no answer, 409, 429, 5xx) or :class:`Gone`
(404), so callers decide what a failed call means for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

GROUP = "gym-checkpoint.dev"
VERSION = "v1alpha1"
#: seconds one API call may take (the client has no deadline of its own)
CALL_TIMEOUT_S = 10.0
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Unavailable(KubeError):
    """No answer, or one worth retrying (409 Conflict, 429 TooManyRequests, 5xx)."""


class Gone(KubeError):
    """404: the object (or its namespace) is not there."""


def _translate(exc: BaseException, what: str) -> KubeError:
    if isinstance(exc, ApiException):
        status = exc.status or None
        retry_after = None
        headers = exc.headers or {}
        if headers.get("Retry-After"):
            try:
                retry_after = float(headers["Retry-After"])
            except ValueError:
                retry_after = None
        message = f"{what}: {status} {exc.reason}"
        if status == 404:
            return Gone(message, status)
        if status in RETRYABLE:
            return Unavailable(message, status, retry_after)
        return KubeError(message, status)
    return Unavailable(f"{what}: no answer from the Kubernetes API ({type(exc).__name__})")


def api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (``$KUBECONFIG``)."""
    cfg = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)
    cfg.retries = 0  # callers retry, with backoff, and know what a failure means
    return client.ApiClient(cfg)


class Kube:
    """Pods to find participants; Checkpoint/Restore objects and their status; credentials Secrets."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls) -> Kube:
        return cls(api_client())

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=CALL_TIMEOUT_S, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _translate(exc, what) from None

    async def openapi_document(self, group_version: str) -> dict[str, Any]:
        """The API server's OpenAPI v3 document of one group-version (the installed CRDs' schemas): readable by every
        authenticated client (the system:discovery role), no RBAC rule needed."""

        def get(_request_timeout: float) -> Any:
            method, url, headers, _, _ = self.api_client.param_serialize(
                method="GET",
                resource_path=f"/openapi/v3/apis/{group_version}",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(method, url, header_params=headers, _request_timeout=_request_timeout)
            response.read()
            if not 200 <= response.status < 300:
                raise ApiException(status=response.status, reason=response.reason)
            return json.loads(response.data or b"{}")

        document = await self._call(f"get the OpenAPI document of {group_version}", get)
        return dict(document or {})

    async def list_pods(self, namespace: str, selector: str) -> list[Any]:
        result = await self._call(
            f"list pods {selector!r}", self.core.list_namespaced_pod, namespace, label_selector=selector
        )
        return list(result.items)

    async def list_statefulsets(self, namespace: str) -> list[Any]:
        """Every StatefulSet of the namespace (the stack's are picked by their pod template's labels)."""
        result = await self._call("list StatefulSets", self.apps.list_namespaced_stateful_set, namespace)
        return list(result.items)

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's decoded data; raises LookupError when missing."""
        try:
            secret = await self._call(f"get Secret {name}", self.core.read_namespaced_secret, name, namespace)
        except Gone:
            raise LookupError(f"Secret {name} does not exist in {namespace}") from None
        data = dict(secret.data or {})
        decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
        decoded.update(secret.string_data or {})
        return decoded

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = await self._call(
                f"get {plural} {name}",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
            )
        except Gone:
            return None
        return dict(found)

    async def list_objects(self, plural: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``plural`` in ``namespace`` (``selector``: only those whose labels match it)."""
        found = await self._call(
            f"list {plural}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            **({"label_selector": selector} if selector else {}),
        )
        return list(found.get("items") or [])

    async def create_object(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create one object (a Checkpoint a schedule, a termination or the catalog sync starts, a Restore of the
        automatic resume); a 409 (the name is taken) is :class:`Unavailable` with status 409."""
        created = await self._call(
            f"create {plural} {(body.get('metadata') or {}).get('name')}",
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            {"apiVersion": f"{GROUP}/{VERSION}", **body},
        )
        return dict(created)

    async def delete_object(self, plural: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object, only if it is still the one with ``uid`` (not a later one of the same name)."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        with contextlib.suppress(Gone):
            await self._call(
                f"delete {plural} {name}",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body=body,
            )

    async def deletion_started(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the Namespace ``namespace`` (kind ``namespace``) or the Deployment ``name`` in it (``deployment``)
        is gone or being deleted. Raises :class:`KubeError` when the API does not say (no answer, or refused: the
        operator's token or Role may be gone already), never taken for a no."""
        try:
            if kind == "namespace":
                found = await self._call(f"get Namespace {namespace}", self.core.read_namespace, namespace)
            else:
                found = await self._call(
                    f"get Deployment {name}", self.apps.read_namespaced_deployment, name, namespace
                )
        except Gone:
            return True
        return found.metadata is not None and found.metadata.deletion_timestamp is not None

    async def remove_finalizers(self, plural: str, found: dict[str, Any], finalizers: set[str]) -> bool:
        """Take ``finalizers`` off an object as it was listed (a merge patch carrying the resourceVersion it was listed
        at: a concurrent change is a 409, :class:`Unavailable`, and the caller lists it again; no ``get``, which the
        chart's Role grants on Checkpoints only); False when the object is gone or carries none of them."""
        meta = found.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        held = list(meta.get("finalizers") or [])
        if not finalizers & set(held):
            return False
        patch = {
            "metadata": {
                "finalizers": [f for f in held if f not in finalizers],
                "resourceVersion": meta.get("resourceVersion"),
            }
        }
        try:
            await self._call(
                f"patch {plural} {name} finalizers",
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
            )
        except Gone:
            return False
        return True

    async def patch_labels(self, plural: str, namespace: str, name: str, labels: dict[str, str]) -> None:
        """A JSON merge patch of ``metadata.labels`` (only these keys)."""
        await self._call(
            f"patch {plural} {name} labels",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            {"metadata": {"labels": labels}},
        )

    async def event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        """An Event on ``obj`` (a Pod, a Checkpoint, ...), posted at once: from a task of the operator's own, outside
        kopf's handlers (whose events kopf posts), or when kopf's event poster has stopped."""
        meta = obj.get("metadata") or {}
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gym-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._call(f"create Event {reason}", self.core.create_namespaced_event, meta.get("namespace"), event)

    async def resource_version(self, plural: str, namespace: str, name: str) -> str | None:
        """The object's resourceVersion now (None: gone). A list by name: the chart's Role grants ``get`` on
        Checkpoints only, ``list`` on both."""
        found = await self._call(
            f"list {plural} {name}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            field_selector=f"metadata.name={name}",
        )
        for item in found.get("items") or []:
            if (item.get("metadata") or {}).get("name") == name:
                return str(item["metadata"].get("resourceVersion") or "") or None
        return None

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> str | None:
        """A JSON merge patch of ``status`` (the status subresource); with ``resource_version``, only over that
        version of the object (else 409 Conflict, :class:`Unavailable`). Returns the object's new resourceVersion."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        written = await self._call(
            f"patch {plural} {name} status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
        )
        version = ((written or {}).get("metadata") or {}).get("resourceVersion") if isinstance(written, dict) else None
        return str(version) if version else None
