"""kemu: kmock's KubernetesEmulator made close enough to kube-apiserver for kubectl, Helm and kopf.

kmock 0.8 keeps objects and serves discovery; this subclass takes over every request addressed to a
resource (list, get, watch, create, replace, patch, delete) and adds what real clients depend on and
what a real API server enforces: authentication and RBAC (auth.py), custom resources decoded,
validated, pruned and defaulted from their CRD's schema with CEL rules (customresources.py),
`fieldValidation` and `Warning` headers, OpenAPI v3 documents (openapi.py), server-set metadata (uid,
resourceVersion, creationTimestamp, generation), 201 on create, `<Kind>List` lists, Table output
with CRD printer columns, `/status` isolation, PUT with optimistic concurrency, server-side apply
that creates, watches that honour resourceVersion, selectors, timeouts and the WatchList bookmark,
canonical `Status` errors, protobuf bodies for the kinds client-go sends that way, and dry runs that
store nothing. See tests/k8s/README.md for the list and the test that checks each behaviour.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import contextvars
import copy
import datetime
import json
import random
import re
import string
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from typing_extensions import override

from . import auth, errors, objectmeta, openapi, patching, protobuf, selectors, tables
from . import fielderrors as fe
from .customresources import CustomResource, validate_crd
from .errors import KemuError
from .harness import PREFIX as HARNESS_PREFIX
from .harness import Harness
from .paths import read_request

HISTORY = 10_000  # watch events kept per resource for watches that resume from a resourceVersion
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")
SECRETS = kmock.resource("", "v1", "secrets")
PODS = kmock.resource("", "v1", "pods")
SERVICEACCOUNTS = kmock.resource("", "v1", "serviceaccounts")
CLUSTERROLES = kmock.resource(auth.RBAC_GROUP, "v1", "clusterroles")
CLUSTERROLEBINDINGS = kmock.resource(auth.RBAC_GROUP, "v1", "clusterrolebindings")
LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")
#: built-in kinds whose strategy refuses an update without metadata.resourceVersion (custom resources do too)
CONDITIONAL_UPDATES_ONLY = frozenset({LEASES})
SA_TOKEN_SECRET = "kubernetes.io/service-account-token"
#: apiextensions-apiserver's finalizer on a deleted CRD until its custom resources are gone
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
#: namespaces the NamespaceLifecycle admission plugin refuses to delete
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
#: a pod's terminationGracePeriodSeconds when its spec has none (core/v1 defaults)
DEFAULT_POD_GRACE_S = 30
# the user the request being served is authenticated as
CURRENT_USER: contextvars.ContextVar[auth.User] = contextvars.ContextVar("kemu_user", default=auth.ADMIN)
DNS_LABEL_NAMED = frozenset({"namespaces", "services"})
SERVER_MANAGED = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")

Key = tuple[kmock.resource, str | None, str]
FIELD_VALIDATIONS = ("Ignore", "Warn", "Strict")
# Warning headers of the request being served (kube-apiserver's `warning.AddWarning`)
WARNINGS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("kemu_warnings", default=None)


def add_warning(text: str) -> None:
    collected = WARNINGS.get()
    if collected is not None and text not in collected:
        collected.append(text)


_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


@dataclass(frozen=True)
class LogEntry:
    """One change of one object, kept so watches can resume and filter old/new states."""

    rv: int
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_version(res: kmock.resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def _version_rank(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA before beta before alpha, then by number (v2 > v1 > v1beta2)."""
    match = _VERSION.match(version)
    if not match:
        return -1, 0, 0
    major, stage, minor = match.groups()
    return {None: 2, "beta": 1, "alpha": 0}[stage], int(major), int(minor or 0)


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


@attrs.define(kw_only=True)
class Kemu(kmock.KubernetesEmulator):
    """The emulator. Run it with `python tests/k8s/emulator.py --port N`, or in-process with kmock.Server."""

    _rv: int = attrs.field(default=0, init=False)
    _log: dict[kmock.resource, collections.deque[LogEntry]] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=HISTORY)), init=False
    )
    _pulse: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _printer_columns: dict[kmock.resource, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _crd_resources: dict[str, set[kmock.resource]] = attrs.field(factory=dict, init=False)
    _cr: dict[kmock.resource, CustomResource] = attrs.field(factory=dict, init=False)
    _tokens: auth.TokenAuthority = attrs.field(factory=auth.TokenAuthority, init=False)
    _authorizer: auth.Authorizer | None = attrs.field(default=None, init=False)
    #: the watch history is compacted up to here: a watch from an older resourceVersion expires (410)
    _compacted: int = attrs.field(default=0, init=False)
    #: the tests' audit log, injected faults and outages (harness.py), admin only
    harness: Harness = attrs.field(factory=Harness, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.harness.compact = self._compact
        self.harness.pulse = self._pulse_watches
        self.resources.load_bundled()
        for name in DEFAULT_NAMESPACES:
            self._commit_create(
                (NAMESPACES, None, name),
                self._new_object(NAMESPACES, {"metadata": {"name": name}}, None, name),
                dry_run=False,
            )
        self._authorizer = auth.Authorizer(
            lambda plural, ns: self._live(kmock.resource(auth.RBAC_GROUP, "v1", plural), ns)
        )
        for res, kind, docs in (
            (CLUSTERROLES, "ClusterRole", auth.BOOTSTRAP_CLUSTER_ROLES),
            (CLUSTERROLEBINDINGS, "ClusterRoleBinding", auth.BOOTSTRAP_CLUSTER_ROLE_BINDINGS),
        ):
            for doc in docs:
                body = {"apiVersion": f"{auth.RBAC_GROUP}/v1", "kind": kind, **copy.deepcopy(doc)}
                body["metadata"]["labels"] = {"kubernetes.io/bootstrapping": "rbac-defaults"}
                name = doc["metadata"]["name"]
                self._commit_create((res, None, name), self._new_object(res, body, None, name), dry_run=False)

    # ---- HTTP entry: protobuf bodies are turned into JSON, then kemu reads the request itself (paths.py) ----

    @override
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.content_type == "application/vnd.kubernetes.protobuf":
            body = await raw_request.read()
            try:
                decoded = protobuf.decode(body)
            except protobuf.UnsupportedKind as exc:
                return errors.unsupported_media_type(
                    f"kemu decodes protobuf only for {sorted(protobuf.TOP_LEVEL_KINDS)}, not {exc.kind!r}; "
                    "send application/json"
                ).response()
            except protobuf.ProtobufError as exc:
                return errors.bad_request(f"invalid protobuf body: {exc}").response()
            raw_request._read_bytes = json.dumps(decoded).encode("utf-8")  # what read()/json() return
        request = await read_request(raw_request)
        try:
            return await self._handle(request)
        except Exception as exc:  # a failure answers this request (a Status, as kube-apiserver does), not the server
            return await self._render_error(exc)

    def _service_account_uid(self, namespace: str, name: str) -> str | None:
        found = self._current((SERVICEACCOUNTS, namespace, name))
        return found["metadata"].get("uid") if found else None

    def _attributes(self, request: kmock.Request, user: auth.User) -> auth.Attributes:
        raw = request._raw_request
        assert raw is not None
        res = request.resource
        if res is None or res.group is None or res.version is None or res.plural is None:
            return auth.Attributes(
                user, raw.method.lower() if raw.method.upper() != "HEAD" else "get", False, path=raw.path
            )
        watch = raw.query.get("watch") in ("true", "1")
        namespace = request.namespace or ""
        if res == NAMESPACES and request.name:
            namespace = request.name  # RequestInfo: a namespace's own requests are in that namespace
        return auth.Attributes(
            user,
            auth.request_verb(raw.method, bool(request.name), watch),
            True,
            api_group=str(res.group),
            resource=str(res.plural),
            subresource=request.subresource or "",
            name=request.name or "",
            namespace=namespace,
        )

    @override
    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        try:
            user = auth.authenticate(raw.headers.get("Authorization"), self._tokens, self._service_account_uid)
        except auth.Unauthenticated:
            return errors.unauthorized().response()
        attributes = self._attributes(request, user)
        assert self._authorizer is not None
        allowed, reason = self._authorizer.authorize(attributes)
        if not allowed:
            why = auth.forbidden_message(attributes) + (f": {reason}" if reason else "")
            self.harness.record(attributes, 403)
            return errors.forbidden(attributes.api_group, attributes.resource, attributes.name, why).response()
        if raw.path.startswith(HARNESS_PREFIX):
            return await self.harness.serve(raw)
        fault = self.harness.fault(attributes)
        if fault is not None:
            self.harness.record(attributes, fault.status)
            response = fault.response()
            if fault.status == 429:
                response.headers["Retry-After"] = "1"
            return response
        entry = self.harness.record(attributes, 0)  # in the audit now: a watch may stream for minutes
        response = await self._authorized(request, raw, user)
        entry.code = response.status
        return response

    async def _authorized(
        self, request: kmock.Request, raw: aiohttp.web.BaseRequest, user: auth.User
    ) -> aiohttp.web.StreamResponse:
        user_token = CURRENT_USER.set(user)
        try:
            if raw.path == "/openapi/v3" or raw.path.startswith("/openapi/v3/"):
                return openapi.serve(raw, self._openapi_documents())
            if raw.path.startswith("/openapi/"):
                return errors.resource_not_found().response()
            res = request.resource
            if res is None or res.group is None or res.version is None or res.plural is None:
                return aiohttp.web.json_response(await self._serve_discovery(request, raw))
            return await self._handle_resource(request)
        finally:
            CURRENT_USER.reset(user_token)

    async def _handle_resource(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        collected: list[str] = []
        token = WARNINGS.set(collected)
        try:
            response = await self._serve_resource(request)
        except KemuError as exc:
            response = exc.response()
        finally:
            WARNINGS.reset(token)
        if not response.prepared:
            for text in collected:
                response.headers.add("Warning", f"299 - {json.dumps(text)}")
        return response

    @override
    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, KemuError):
            return exc.response()
        if isinstance(exc, kmock.KubernetesError):
            reason = "NotFound" if exc.status == 404 else (exc.reason or "InternalError")
            message = "the server could not find the requested resource" if exc.status == 404 else str(exc.message)
            return KemuError(exc.status, reason, message).response()
        return KemuError(500, "InternalError", repr(exc), {"traceback": traceback.format_exc()}).response()

    # ---- discovery fixes ----

    async def _serve_discovery(self, request: kmock.Request, raw: aiohttp.web.BaseRequest) -> kmock.Payload:
        """`/`, `/version`, `/api`, `/apis`, `/api/<v>`, `/apis/<g>`, `/apis/<g>/<v>` (GET); anything else is 404."""
        parts = raw.path.strip("/").split("/") if raw.path.strip("/") else []
        if raw.method.upper() == "GET":
            if not parts:
                return await self._serve_root(request)
            if parts == ["version"]:
                return await self._serve_server_version(request)
            if parts == ["api"]:
                return await self._serve_api(request)
            if parts == ["apis"]:
                return await self._serve_apis(request)
            if len(parts) == 2 and parts[0] == "apis":
                return await self._serve_group(request)
            if (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
                return await self._serve_version(request)
        raise kmock.KubernetesEndpointNotFoundError()

    @override
    async def _serve_server_version(self, request: kmock.Request) -> kmock.Payload:
        return {
            "major": "1",
            "minor": "36",
            "gitVersion": "v1.36.0+kemu",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _group_versions(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = collections.defaultdict(set)
        for res in self._get_resources():
            if isinstance(res.group, str) and res.group and isinstance(res.version, str):
                groups[res.group].add(res.version)
        return {group: sorted(versions, key=_version_rank, reverse=True) for group, versions in groups.items()}

    @staticmethod
    def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
        return {
            "name": group,
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
            "versions": [{"groupVersion": f"{group}/{version}", "version": version} for version in versions],
        }

    @override
    async def _serve_apis(self, request: kmock.Request) -> kmock.Payload:
        return {
            "apiVersion": "v1",
            "kind": "APIGroupList",
            "groups": [self._group_doc(group, versions) for group, versions in sorted(self._group_versions().items())],
        }

    @override
    async def _serve_group(self, request: kmock.Request) -> kmock.Payload:
        assert request.resource is not None
        versions = self._group_versions().get(str(request.resource.group))
        if not versions:
            raise errors.resource_not_found()
        return {"apiVersion": "v1", "kind": "APIGroup", **self._group_doc(str(request.resource.group), versions)}

    @override
    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        assert request.resource is not None
        group, version = request.resource.group, request.resource.version
        found = [
            res
            for res in self._get_resources()
            if res.group == group and res.version == version and isinstance(res.plural, str)
        ]
        if not found and group != "":
            raise errors.resource_not_found()
        entries = []
        for res in sorted(found, key=lambda item: str(item.plural)):
            info = self._resources[res] if res in self._resources else kmock.ResourceInfo()
            for sub in ["", *sorted(info.subresources)]:
                entries.append(
                    {
                        "name": f"{res.plural}/{sub}" if sub else res.plural,
                        "singularName": "" if sub else (info.singular or str(info.kind or "").lower()),
                        "namespaced": bool(info.namespaced),
                        "kind": info.kind or str(res.plural).capitalize(),
                        "verbs": sorted(info.verbs) if not sub else ["get", "patch", "update"],
                        **(
                            {}
                            if sub
                            else {"shortNames": sorted(info.shortnames), "categories": sorted(info.categories)}
                        ),
                    }
                )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else str(version),
            "resources": entries,
        }

    @override
    def _get_resources(self) -> list[kmock.resource]:
        # Only declared resources (bundled, CRDs, user-declared): kmock also counts resources of stored
        # objects, which would keep a deleted CRD's group discoverable through its soft-deleted objects.
        return kmock.KubernetesScaffold._get_resources(self)

    # ---- storage helpers ----

    def _info(self, res: kmock.resource) -> kmock.ResourceInfo:
        if res not in self._resources:
            raise errors.resource_not_found()
        return self._resources[res]

    def _current(self, key: Key) -> dict[str, Any] | None:
        if key not in self._objects:
            return None
        stored = self._objects[key]
        return None if stored.deleted else self._view(key[0], stored.raw)

    def _view(self, res: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as reads return it: custom resources decoded with their CRD's schema (pruned, defaulted)."""
        cr = self._cr.get(res)
        return cr.read(obj) if cr is not None else copy.deepcopy(obj)

    def _live(self, res: kmock.resource, namespace: str | None) -> list[dict[str, Any]]:
        found = [
            self._view(each, stored.raw)
            for (each, ns, _), stored in self._objects.items()
            if each == res and not stored.deleted and (namespace is None or ns == namespace)
        ]
        return sorted(found, key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"]))

    def _compact(self) -> int:
        """etcd compaction as the watch cache sees it: history up to now is gone; returns the revision."""
        for log in self._log.values():
            log.clear()
        self._compacted = self._rv
        return self._rv

    def _pulse_watches(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self._log[res].append(
            LogEntry(
                int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj), copy.deepcopy(old) if old else None
            )
        )
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    def _store(self, key: Key, obj: dict[str, Any]) -> None:
        if key in self._objects:
            self._objects[key].history.append(copy.deepcopy(obj))
        else:
            self._objects[key] = copy.deepcopy(obj)

    # ---- object semantics ----

    def _apply_kind_defaults(self, res: kmock.resource, obj: dict[str, Any]) -> None:
        """What kube-apiserver's strategies fill in or convert for a few kinds."""
        if res == SECRETS:
            for key, value in (obj.pop("stringData", None) or {}).items():
                obj.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode("ascii")
            if not obj.get("type"):
                obj["type"] = "Opaque"
            if obj["type"] == SA_TOKEN_SECRET and not (obj.get("data") or {}).get("token"):
                self._fill_token_secret(obj)
        elif res == NAMESPACES:
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"}
        elif res == PODS:
            obj.setdefault("status", {"phase": "Pending"})
        elif res == CRD_RESOURCE:
            status = self._crd_status(obj)
            if (obj.get("status") or {}).get("conditions"):
                status["conditions"] = obj["status"]["conditions"]  # keep the transition times
            obj["status"] = status

    def _fill_token_secret(self, secret: dict[str, Any]) -> None:
        """The token controller's work: a legacy ServiceAccount token Secret gets a token that never expires."""
        meta = secret["metadata"]
        annotations = meta.setdefault("annotations", {})
        sa_name = annotations.get("kubernetes.io/service-account.name")
        namespace = meta.get("namespace") or ""
        uid = self._service_account_uid(namespace, sa_name) if sa_name else None
        if not uid:
            return
        annotations["kubernetes.io/service-account.uid"] = uid
        token, _ = self._tokens.issue(namespace, sa_name, uid, seconds=None, secret_name=meta.get("name", ""))
        data = secret.setdefault("data", {})
        data["token"] = base64.b64encode(token.encode()).decode("ascii")
        data["namespace"] = base64.b64encode(namespace.encode()).decode("ascii")

    def _token_request(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """TokenRequest (`kubectl create token NAME`): a token for an existing ServiceAccount."""
        uid = self._service_account_uid(namespace, name)
        if uid is None:
            raise errors.not_found("", "serviceaccounts", name)
        spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise errors.invalid_fields(
                "authentication.k8s.io",
                "TokenRequest",
                name,
                [fe.invalid("spec.expirationSeconds", seconds, "may not specify a duration less than 10 minutes")],
            )
        token, expires = self._tokens.issue(namespace, name, uid, spec.get("audiences"), seconds)
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": {
                "audiences": spec.get("audiences") or [auth.AUDIENCE],
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {
                "token": token,
                "expirationTimestamp": datetime.datetime.fromtimestamp(expires or 0, tz=datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            },
        }

    def _review(self, res: kmock.resource, namespace: str | None, body: Any) -> dict[str, Any]:
        """SelfSubjectAccessReview / SubjectAccessReview / SelfSubjectReview, answered by this authorizer."""
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be an object")
        user = CURRENT_USER.get()
        out = copy.deepcopy(body)
        out.setdefault("metadata", {})
        if res.plural == "selfsubjectreviews":
            out["status"] = {"userInfo": user.as_user_info()}
            return out
        spec = out.get("spec") or {}
        if res.plural in ("subjectaccessreviews", "localsubjectaccessreviews"):
            user = auth.User(spec.get("user") or "", tuple(spec.get("groups") or ()), spec.get("uid") or "")
        if res.plural not in ("selfsubjectaccessreviews", "subjectaccessreviews", "localsubjectaccessreviews"):
            raise errors.method_not_allowed(f"kemu does not answer {res.plural}")
        assert self._authorizer is not None
        resource_attrs = spec.get("resourceAttributes")
        if resource_attrs is not None:
            attrs = auth.Attributes(
                user,
                resource_attrs.get("verb") or "",
                True,
                api_group=resource_attrs.get("group") or "",
                resource=resource_attrs.get("resource") or "",
                subresource=resource_attrs.get("subresource") or "",
                name=resource_attrs.get("name") or "",
                namespace=resource_attrs.get("namespace") or namespace or "",
            )
        else:
            non_resource = spec.get("nonResourceAttributes") or {}
            attrs = auth.Attributes(user, non_resource.get("verb") or "", False, path=non_resource.get("path") or "")
        allowed, reason = self._authorizer.authorize(attrs)
        out["status"] = {"allowed": allowed, **({"reason": reason} if reason else {})}
        return out

    def _openapi_documents(self) -> dict[str, dict[str, Any]]:
        return openapi.documents(
            [(res, self._resources[res]) for res in self._get_resources() if res in self._resources], self._cr
        )

    @staticmethod
    def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
        spec = crd.get("spec", {})
        stamp = now_rfc3339()
        return {
            "acceptedNames": spec.get("names", {}),
            "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": stamp,
                },
            ],
        }

    def _new_object(
        self, res: kmock.resource, body: Any, url_namespace: str | None, url_name: str | None = None
    ) -> dict[str, Any]:
        """Validate a create body and fill in what the server sets (except the resourceVersion)."""
        info = self._info(res)
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON or YAML object")
        obj = copy.deepcopy(body)
        meta = obj.get("metadata") or {}
        obj["metadata"] = meta
        if info.namespaced:
            body_ns = meta.get("namespace")
            if url_namespace and body_ns and body_ns != url_namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = url_namespace or body_ns
            if not namespace:
                raise errors.bad_request("a namespace is required for namespaced resources")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if url_name is not None and meta.get("name") not in (None, url_name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({url_name})"
            )
        if url_name is not None:
            meta["name"] = url_name
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        if not meta.get("name"):
            raise errors.invalid_fields(
                str(res.group), info.kind or "", "", objectmeta.validate(meta, bool(info.namespaced))
            )
        obj["apiVersion"] = obj.get("apiVersion") or api_version(res)
        obj["kind"] = obj.get("kind") or info.kind
        if "status" in info.subresources:
            obj.pop("status", None)  # status is written through /status only
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        self._apply_kind_defaults(res, obj)
        return obj

    def _commit_create(self, key: Key, obj: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        res = key[0]
        self._validate(res, obj, None, None)
        if self._current(key) is not None:
            raise errors.already_exists(str(res.group), str(res.plural), key[2])
        self._admit_create(res, key)
        if dry_run:
            return obj
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._store(key, obj)
        self._emit(res, "ADDED", obj, None)
        if res == CRD_RESOURCE:
            self._register_crd(obj)
        return obj

    def _commit_update(
        self, key: Key, current: dict[str, Any], new: dict[str, Any], dry_run: bool, sub: str | None = None
    ) -> dict[str, Any]:
        """Keep server-managed fields, bump generation on spec changes, store, finish pending deletions."""
        res = key[0]
        meta = new.get("metadata") if isinstance(new.get("metadata"), dict) else {}
        new["metadata"] = meta
        old_meta = current["metadata"]
        for field in ("name", "namespace", *SERVER_MANAGED):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        for field in ("managedFields", "selfLink"):
            meta.pop(field, None)
        new["apiVersion"], new["kind"] = current.get("apiVersion"), current.get("kind")
        self._apply_kind_defaults(res, new)
        if res in self._cr:
            # customresource strategy: any change outside metadata bumps the generation; /status writes never do
            changed = {k: v for k, v in new.items() if k != "metadata"} != {
                k: v for k, v in current.items() if k != "metadata"
            }
            if changed and sub != "status":
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        elif _spec_part(new) != _spec_part(current):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        self._validate(res, new, current, sub)
        if new == current:
            return current  # a no-op write changes nothing, as in kube-apiserver
        if dry_run:
            return new
        meta["resourceVersion"] = str(self._next_rv())
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not meta.get("deletionGracePeriodSeconds"):
            return self._remove(key, new)  # (a pod in its grace period goes when that ends)
        self._store(key, new)
        self._emit(res, "MODIFIED", new, current)
        if res == CRD_RESOURCE:
            self._register_crd(new)
        return new

    def _remove(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        res = key[0]
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._objects[key].history.append(copy.deepcopy(obj))
        self._objects[key].delete()
        self._emit(res, "DELETED", obj, None)
        if res == CRD_RESOURCE:
            self._unregister_crd(obj)
        elif res == NAMESPACES:
            self._purge(lambda each, ns: ns == key[2])
        else:
            if key[1]:
                self._finish_namespace(key[1])
            for crd_name, resources in list(self._crd_resources.items()):
                if res in resources:
                    self._finish_crd(crd_name)
        return obj

    def _purge(self, condition: Any) -> None:
        for (each, ns, name), stored in list(self._objects.items()):
            if not stored.deleted and condition(each, ns):
                self._remove((each, ns, name), copy.deepcopy(stored.raw))

    def _admit_create(self, res: kmock.resource, key: Key) -> None:
        """Nothing new in a Terminating namespace (the NamespaceLifecycle admission plugin), and no custom resource
        of a CRD being deleted (apiextensions' crdHandler: 405)."""
        namespace = self._current((NAMESPACES, None, key[1])) if key[1] else None
        if namespace is not None and namespace["metadata"].get("deletionTimestamp"):
            raise KemuError(
                403,
                "Forbidden",
                f'{errors.qualified(str(res.group), str(res.plural))} "{key[2]}" is forbidden: unable to create new '
                f"content in namespace {key[1]} because it is being terminated",
                {
                    "name": key[2],
                    "group": str(res.group),
                    "kind": str(res.plural),
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {key[1]} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )
        for crd_name, resources in self._crd_resources.items():
            if res in resources:
                crd = self._current((CRD_RESOURCE, None, crd_name))
                if crd is not None and crd["metadata"].get("deletionTimestamp"):
                    raise KemuError(
                        405,
                        "MethodNotAllowed",
                        "create not allowed while custom resource definition is terminating",
                        {"group": str(res.group), "kind": str(res.plural)},
                    )

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        group, plural = spec.get("group"), names.get("plural")
        if not group or not plural:
            return
        registered: set[kmock.resource] = set()
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            res = kmock.resource(group, version["name"], plural)
            subresources = set((version.get("subresources") or {}).keys())
            self._resources[res] = kmock.ResourceInfo(
                kind=names.get("kind"),
                singular=names.get("singular") or str(names.get("kind", "")).lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=set(ALL_VERBS),
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                subresources=subresources & {"status", "scale"},
            )
            self._printer_columns[res] = list(version.get("additionalPrinterColumns") or [])
            self._cr[res] = CustomResource(crd, version)
            registered.add(res)
        crd_name = crd["metadata"]["name"]
        for stale in self._crd_resources.get(crd_name, set()) - registered:
            self._drop_resource(stale)
        self._crd_resources[crd_name] = registered

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        for res in self._crd_resources.pop(crd["metadata"]["name"], set()):
            self._drop_resource(res)

    def _drop_resource(self, res: kmock.resource) -> None:
        self._purge(lambda each, ns: each == res)
        if res in self._resources:
            del self._resources[res]
        self._printer_columns.pop(res, None)
        self._cr.pop(res, None)

    # ---- request dispatch ----

    async def _serve_resource(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None and request.resource is not None
        res, namespace, name, sub = request.resource, request.namespace, request.name, request.subresource
        info = self._info(res)
        if not info.namespaced and namespace is not None:
            raise errors.resource_not_found()
        if res == SERVICEACCOUNTS and sub == "token" and namespace and name:
            if raw.method.upper() != "POST":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return self._respond(
                raw, self._token_request(namespace, name, self._body(request, optional=True)), status=201
            )
        if sub is not None and (sub != "status" or "status" not in info.subresources):
            raise errors.resource_not_found()
        if res.group in ("authorization.k8s.io", "authentication.k8s.io") and raw.method.upper() == "POST":
            return self._respond(raw, self._review(res, namespace, self._body(request)), status=201)
        query = raw.query
        dry_run = "All" in query.getall("dryRun", [])
        key: Key | None = (res, namespace if info.namespaced else None, name) if name else None
        method = raw.method.upper()

        if method == "GET" and query.get("watch") in ("true", "1"):
            return await self._watch(request, res, namespace, name)
        if method == "GET" and key is None:
            return self._respond(raw, self._list(res, namespace, query), list_of=(res, info))
        if method == "GET" and key is not None:
            return self._respond(raw, self._get(key), one_of=(res, info))
        directive = query.get("fieldValidation") or "Warn"
        if directive not in FIELD_VALIDATIONS:
            raise errors.invalid_fields(
                "meta.k8s.io",
                f"{dict(POST='Create', PUT='Update').get(method, 'Patch')}Options",
                "",
                [fe.not_supported("fieldValidation", directive, list(FIELD_VALIDATIONS))],
            )
        if method == "POST" and key is None:
            obj = self._new_object(res, self._decode(res, self._body(request), directive, "body"), namespace)
            obj_key = (res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            return self._respond(raw, self._commit_create(obj_key, obj, dry_run), status=201)
        if method == "PUT" and key is not None:
            return self._respond(raw, self._replace(key, info, sub, self._body(request), dry_run, directive))
        if method == "PATCH" and key is not None:
            obj, created = self._patch(key, info, sub, raw.content_type, self._body(request), dry_run, directive)
            return self._respond(raw, obj, status=201 if created else 200)
        if method == "DELETE" and key is not None:
            return self._respond(raw, self._delete(key, self._body(request, optional=True), dry_run))
        if method == "DELETE":
            return self._respond(raw, self._delete_collection(res, namespace, query, dry_run))
        raise errors.method_not_allowed("the server does not allow this method on the requested resource")

    @staticmethod
    def _body(request: kmock.Request, optional: bool = False) -> Any:
        if request.data is not None and not hasattr(request.data, "getall"):
            return request.data
        if not request.text.strip():
            if optional:
                return None
            raise errors.bad_request("the request body is empty")
        try:
            return yaml.safe_load(request.text)  # server-side apply may send YAML
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"the request body is neither JSON nor YAML: {exc}") from exc

    def _decode(self, res: kmock.resource, body: Any, directive: str, mode: str, key: Key | None = None) -> Any:
        """A custom resource body through the CRD codec: pruned, defaulted; unknown fields per `fieldValidation`.

        `mode` is how the apiserver reports unknown fields under Strict: `body` (create/update: 400
        `... cannot be handled as a <Kind>: strict decoding error: ...`), `patch` (422 on the field
        `patch`) or `apply` (server-side apply: 500 `failed to create typed patch object`).
        """
        cr = self._cr.get(res)
        if cr is None or not isinstance(body, dict):
            return body
        decoded = copy.deepcopy(body)
        try:
            unknown = cr.decode(decoded)
        except objectmeta.MetadataError as exc:
            raise errors.bad_request(
                f'{cr.kind} in version "{cr.version}" cannot be handled as a {cr.kind}: {exc}'
            ) from exc
        if mode == "apply" and unknown:
            ns, name = (key[1], key[2]) if key else ("<unknown>", "<unknown>")
            problems = [f".{path}: field not declared in schema" for path in unknown]
            detail = problems[0] if len(problems) == 1 else "errors:\n  " + "\n  ".join(problems)
            raise KemuError(
                500,
                "",
                f"failed to create typed patch object ({ns or ''}/{name}; "
                f"{cr.group}/{cr.version}, Kind={cr.kind}): {detail}",
            )
        if not unknown or directive == "Ignore":
            return decoded
        messages = [f'unknown field "{path}"' for path in unknown]
        if directive == "Warn":
            for message in messages:
                add_warning(message)
            return decoded
        strict = "strict decoding error: " + ", ".join(messages)
        if mode == "patch":
            raise errors.invalid_fields("", "", "", [fe.invalid("patch", fe.go_json(body), strict)])
        raise errors.bad_request(f'{cr.kind} in version "{cr.version}" cannot be handled as a {cr.kind}: {strict}')

    def _validate(self, res: kmock.resource, obj: dict[str, Any], old: dict[str, Any] | None, sub: str | None) -> None:
        """The registry strategy's validation: 422 Invalid with every field error, warnings as headers."""
        name = (obj.get("metadata") or {}).get("name") or ""
        cr = self._cr.get(res)
        if res == CRD_RESOURCE:
            found = validate_crd(obj)
            if found:
                raise errors.invalid_fields("apiextensions.k8s.io", "CustomResourceDefinition", name, found)
            return
        if cr is None:
            if old is None:
                info = self._info(res)
                rule = (
                    "label"
                    if res.plural in DNS_LABEL_NAMED
                    else "path"
                    if res.group == auth.RBAC_GROUP
                    else "subdomain"
                )
                found = objectmeta.validate(obj.get("metadata") or {}, bool(info.namespaced), rule)
                if found:
                    raise errors.invalid_fields(str(res.group), info.kind or "", name, found)
            return
        if old is None:
            found, warnings = cr.validate_create(obj)
        elif sub == "status":
            found, warnings = cr.validate_status_update(obj, old)
        else:
            found, warnings = cr.validate_update(obj, old)
        for warning in warnings:
            add_warning(warning)
        if found:
            raise errors.invalid_fields(cr.group, cr.kind, name, found)

    def _get(self, key: Key) -> dict[str, Any]:
        obj = self._current(key)
        if obj is None:
            raise errors.not_found(str(key[0].group), str(key[0].plural), key[2])
        return obj

    def _list(self, res: kmock.resource, namespace: str | None, query: Any) -> list[dict[str, Any]]:
        by_labels = selectors.label_selector(query.get("labelSelector"))
        by_fields = selectors.field_selector(query.get("fieldSelector"))
        return [obj for obj in self._live(res, namespace) if by_labels(obj) and by_fields(obj)]

    def _replace(
        self, key: Key, info: kmock.ResourceInfo, sub: str | None, body: Any, dry_run: bool, directive: str = "Warn"
    ) -> dict[str, Any]:
        current = self._get(key)
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be an object")
        body = self._decode(key[0], body, directive, "body")
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, key[2]):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({key[2]})"
            )
        if (key[0] in self._cr or key[0] in CONDITIONAL_UPDATES_ONLY) and not meta.get("resourceVersion"):
            # custom resources and Leases do not allow unconditional updates (generic registry Store.Update;
            # leaseStrategy.AllowUnconditionalUpdate is false): leader election depends on it
            raise errors.invalid_fields(
                str(key[0].group),
                str(key[0].plural),
                key[2],
                [fe.invalid("metadata.resourceVersion", 0, "must be specified for an update")],
            )
        self._check_rv(key, current, meta.get("resourceVersion"))
        return self._commit_update(key, current, self._isolate(info, sub, current, copy.deepcopy(body)), dry_run, sub)

    def _patch(
        self,
        key: Key,
        info: kmock.ResourceInfo,
        sub: str | None,
        content_type: str,
        body: Any,
        dry_run: bool,
        directive: str = "Warn",
    ) -> tuple[dict[str, Any], bool]:
        if content_type not in patching.PATCH_TYPES:
            raise errors.unsupported_media_type(
                f"the body of the request was in an unknown format - accepted "
                f"media types include: {', '.join(sorted(patching.PATCH_TYPES))}"
            )
        current = self._current(key)
        if current is None:
            if content_type != patching.APPLY_PATCH or sub is not None:
                raise errors.not_found(str(key[0].group), str(key[0].plural), key[2])
            body = self._decode(key[0], body, directive, "apply", key)
            obj = self._new_object(key[0], body, key[1], key[2])  # server-side apply creates
            return self._commit_create(key, obj, dry_run), True
        if isinstance(body, dict):
            self._check_rv(key, current, (body.get("metadata") or {}).get("resourceVersion"))
        try:
            patched = patching.apply_patch(content_type, copy.deepcopy(current), body)
        except patching.PatchTestFailed as exc:
            raise errors.invalid(str(key[0].group), str(current.get("kind")), key[2], str(exc)) from exc
        patched = self._decode(
            key[0], patched, directive, "apply" if content_type == patching.APPLY_PATCH else "patch", key
        )
        return self._commit_update(key, current, self._isolate(info, sub, current, patched), dry_run, sub), False

    @staticmethod
    def _isolate(
        info: kmock.ResourceInfo, sub: str | None, current: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        """Writes to /status change only .status; other writes cannot change .status."""
        if "status" not in info.subresources:
            return new
        source, target = (new, copy.deepcopy(current)) if sub == "status" else (current, new)
        if "status" in source:
            target["status"] = copy.deepcopy(source["status"])
        else:
            target.pop("status", None)
        return target

    @staticmethod
    def _check_rv(key: Key, current: dict[str, Any], wanted: str | None) -> None:
        if wanted and wanted != current["metadata"].get("resourceVersion"):
            raise errors.conflict(
                str(key[0].group),
                str(key[0].plural),
                key[2],
                "the object has been modified; please apply your changes to the latest version and try again",
            )

    def _delete(self, key: Key, options: Any, dry_run: bool) -> dict[str, Any]:
        current = self._get(key)
        options = options if isinstance(options, dict) else {}
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise errors.conflict(
                str(key[0].group),
                str(key[0].plural),
                key[2],
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}",
            )
        self._check_rv(key, current, pre.get("resourceVersion"))
        if key[0] == NAMESPACES and key[2] in IMMORTAL_NAMESPACES:
            raise errors.forbidden("", "namespaces", key[2], "this namespace may not be deleted")
        if dry_run:
            return current
        if key[0] == NAMESPACES:
            return self._delete_namespace(key, current)
        if key[0] == CRD_RESOURCE:
            return self._delete_crd(key, current)
        grace = self._grace_period(key[0], current, options)
        if grace > 0 or meta.get("finalizers"):
            return self._mark_deleting(key, current, grace)
        return self._remove(key, current)

    @staticmethod
    def _grace_period(res: kmock.resource, obj: dict[str, Any], options: dict[str, Any]) -> int:
        """Seconds a deleted object stays Terminating (rest.BeforeDelete with the pod strategy's CheckGracefulDelete):
        a pod gets DeleteOptions.gracePeriodSeconds, else its terminationGracePeriodSeconds; an unscheduled
        (no nodeName) or finished pod goes at once; every other kind has no graceful deletion."""
        if res != PODS:
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        wanted = options.get("gracePeriodSeconds")
        if wanted is None or int(wanted) < 0:
            wanted = spec.get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_S)
        return max(0, int(wanted))

    def _mark_deleting(self, key: Key, current: dict[str, Any], grace: int) -> dict[str, Any]:
        """deletionTimestamp (now + grace) and deletionGracePeriodSeconds; the first time, generation + 1
        (registry.markAsDeleting, rest.BeforeDelete). A pod's grace may only shorten; it goes when it runs out."""
        meta = current["metadata"]
        left = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and (grace >= (left or 0) or key[0] != PODS):
            return current
        new = copy.deepcopy(current)
        stamp = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=grace)
        new["metadata"].update(deletionTimestamp=stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), deletionGracePeriodSeconds=grace)
        if not meta.get("deletionTimestamp") and int(meta.get("generation") or 0) > 0:
            new["metadata"]["generation"] = int(meta["generation"]) + 1
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        self._store(key, new)
        self._emit(key[0], "MODIFIED", new, current)
        if grace > 0:
            asyncio.get_running_loop().call_later(grace, self._grace_over, key, meta.get("uid"), grace)
        return new

    def _grace_over(self, key: Key, uid: str | None, grace: int) -> None:
        """The kubelet's last word on a terminated pod: it goes (or waits, grace 0, for its finalizers)."""
        current = self._current(key)
        if current is None or current["metadata"].get("uid") != uid:
            return
        if current["metadata"].get("deletionGracePeriodSeconds") != grace:
            return  # a later deletion shortened the grace period; its own timer ends it
        if not current["metadata"].get("finalizers"):
            self._remove(key, current)
            return
        new = copy.deepcopy(current)
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        self._store(key, new)
        self._emit(key[0], "MODIFIED", new, current)

    def _delete_namespace(self, key: Key, current: dict[str, Any]) -> dict[str, Any]:
        """The namespace registry marks it Terminating; the namespace controller deletes everything in it (objects
        with finalizers, and pods in their grace period, stay until they go) and then the namespace itself."""
        if not current["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(current)
            new["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
            new["status"] = {"phase": "Terminating"}
            new["metadata"]["resourceVersion"] = str(self._next_rv())
            self._store(key, new)
            self._emit(NAMESPACES, "MODIFIED", new, current)
            current = new
        for res, obj in self._contents(lambda each, ns: ns == key[2]):
            if not obj["metadata"].get("deletionTimestamp"):
                self._delete((res, key[2], obj["metadata"]["name"]), None, False)
        return self._finish_namespace(key[2]) or current

    def _finish_namespace(self, name: str) -> dict[str, Any] | None:
        """A Terminating namespace goes once nothing is left in it (its `kubernetes` finalizer is then removed)."""
        current = self._current((NAMESPACES, None, name))
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return None
        if self._contents(lambda each, ns: ns == name):
            return None
        return self._remove((NAMESPACES, None, name), current)

    def _delete_crd(self, key: Key, current: dict[str, Any]) -> dict[str, Any]:
        """apiextensions' CRD registry: the CRD gets the cleanup finalizer and a Terminating condition; its
        finalizer controller deletes every custom resource (finalizers honoured) and then releases the CRD."""
        if not current["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(current)
            meta = new["metadata"]
            meta.update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
            if CRD_CLEANUP_FINALIZER not in (meta.get("finalizers") or []):
                meta["finalizers"] = [*(meta.get("finalizers") or []), CRD_CLEANUP_FINALIZER]
            conditions = [
                c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "Terminating"
            ]
            conditions.append(
                {
                    "type": "Terminating",
                    "status": "True",
                    "reason": "InstanceDeletionInProgress",
                    "message": "CustomResource deletion is in progress",
                    "lastTransitionTime": now_rfc3339(),
                }
            )
            new.setdefault("status", {})["conditions"] = conditions
            meta["resourceVersion"] = str(self._next_rv())
            self._store(key, new)
            self._emit(CRD_RESOURCE, "MODIFIED", new, current)
            current = new
        resources = self._crd_resources.get(key[2], set())
        for res, obj in self._contents(lambda each, ns: each in resources):
            if not obj["metadata"].get("deletionTimestamp"):
                meta = obj["metadata"]
                self._delete((res, meta.get("namespace"), meta["name"]), None, False)
        return self._finish_crd(key[2]) or current

    def _finish_crd(self, name: str) -> dict[str, Any] | None:
        """A deleted CRD loses its cleanup finalizer once none of its custom resources is left."""
        key: Key = (CRD_RESOURCE, None, name)
        current = self._current(key)
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return None
        resources = self._crd_resources.get(name, set())
        if self._contents(lambda each, ns: each in resources):
            return None
        new = copy.deepcopy(current)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"].get("finalizers") or [] if f != CRD_CLEANUP_FINALIZER
        ]
        if not new["metadata"]["finalizers"]:
            return self._remove(key, new)
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        self._store(key, new)
        self._emit(CRD_RESOURCE, "MODIFIED", new, current)
        return new

    def _contents(self, condition: Any) -> list[tuple[kmock.resource, dict[str, Any]]]:
        """Live objects (not namespaces, not CRDs) for which `condition(resource, namespace)` holds."""
        return [
            (each, self._view(each, stored.raw))
            for (each, ns, _), stored in list(self._objects.items())
            if not stored.deleted and each not in (NAMESPACES, CRD_RESOURCE) and condition(each, ns)
        ]

    def _delete_collection(
        self, res: kmock.resource, namespace: str | None, query: Any, dry_run: bool
    ) -> list[dict[str, Any]]:
        removed = []
        for obj in self._list(res, namespace, query):
            meta = obj["metadata"]
            removed.append(self._delete((res, meta.get("namespace"), meta["name"]), None, dry_run))
        return removed

    # ---- rendering ----

    def _respond(
        self,
        raw: aiohttp.web.BaseRequest,
        payload: Any,
        status: int = 200,
        list_of: tuple[kmock.resource, kmock.ResourceInfo] | None = None,
        one_of: tuple[kmock.resource, kmock.ResourceInfo] | None = None,
    ) -> aiohttp.web.Response:
        accept = raw.headers.get("Accept", "")
        rv = str(self._rv)
        target = list_of or one_of
        if target is not None and "as=Table" in accept:
            items = payload if list_of else [payload]
            body = tables.build_table(
                items, self._printer_columns.get(target[0]), rv, raw.query.get("includeObject", "Metadata")
            )
        elif target is not None and "as=PartialObjectMetadata" in accept:
            partial = [
                {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
                for obj in (payload if list_of else [payload])
            ]
            body = (
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": rv},
                    "items": partial,
                }
                if list_of
                else partial[0]
            )
        elif list_of is not None:
            body = {
                "kind": f"{list_of[1].kind}List",
                "apiVersion": api_version(list_of[0]),
                "metadata": {"resourceVersion": rv},
                "items": payload,
            }
        elif isinstance(payload, list):
            body = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": payload}
        else:
            body = payload
        return aiohttp.web.json_response(body, status=status)

    # ---- watch ----

    async def _watch(
        self, request: kmock.Request, res: kmock.resource, namespace: str | None, name: str | None
    ) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        query = raw.query
        by_labels = selectors.label_selector(query.get("labelSelector"))
        by_fields = selectors.field_selector(query.get("fieldSelector"))

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata", {})
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta.get("name") == name)
                and by_labels(obj)
                and by_fields(obj)
            )

        try:
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        except ValueError as exc:
            raise errors.bad_request("timeoutSeconds must be a number") from exc
        deadline = time.monotonic() + timeout if timeout is not None else None
        send_initial = query.get("sendInitialEvents") == "true"
        since = query.get("resourceVersion", "")
        log = self._log[res]

        initial: list[dict[str, Any]] = []
        if send_initial or since in ("", "0"):
            initial = [{"type": "ADDED", "object": obj} for obj in self._live(res, namespace) if matches(obj)]
            cursor = self._rv
        else:
            try:
                cursor = int(since)
            except ValueError as exc:
                raise errors.bad_request(f"invalid resourceVersion {since!r}") from exc
        # events older than this are gone (compacted, or fell out of the history): a watch from before it expires
        oldest = max(self._compacted, log[0].rv - 1 if len(log) == log.maxlen else 0)
        expired = not send_initial and since not in ("", "0") and cursor < oldest

        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(raw)
        if expired:
            # the watch cache answers 200 and streams one ERROR event with the 410 Status, then ends the stream
            gone = errors.expired(f"too old resource version: {cursor} ({oldest + 1})").as_status()
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode("utf-8") + b"\n")
            await response.write_eof()
            return response
        opened = time.monotonic()
        user = CURRENT_USER.get().name

        async def send(event: dict[str, Any]) -> None:
            if res in self._cr and event["type"] != "BOOKMARK":
                event = {**event, "object": self._view(res, event["object"])}
            await response.write(json.dumps(event).encode("utf-8") + b"\n")

        try:
            for event in initial:
                await send(event)
            if send_initial:
                info = self._info(res)
                await send(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": info.kind,
                            "apiVersion": api_version(res),
                            "metadata": {
                                "resourceVersion": str(cursor),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )
            while True:
                pulse = self._pulse
                stall = self.harness.stall_of(str(res.plural), user, opened)
                if stall is not None:
                    # a half-open connection: nothing more arrives, the client sees no end; dropped at the stall's end
                    await asyncio.sleep(max(0.0, stall - time.monotonic()))
                    if raw.transport is not None:
                        raw.transport.abort()
                    return response
                for entry in [entry for entry in log if entry.rv > cursor]:
                    cursor = entry.rv
                    event = self._translate(entry, matches)
                    if event is not None:
                        await send(event)
                remaining = deadline - time.monotonic() if deadline is not None else 5.0
                if remaining <= 0 or raw.transport is None or raw.transport.is_closing():
                    break
                # (a stall requested meanwhile is seen at once: the harness pulses every stream)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pulse.wait(), timeout=min(remaining, 5.0))
        except ConnectionError:  # the client went away
            return response
        await response.write_eof()
        return response

    @staticmethod
    def _translate(entry: LogEntry, matches: Any) -> dict[str, Any] | None:
        """A MODIFIED that moves an object into or out of the selection is an ADDED or a DELETED."""
        now, before = matches(entry.obj), matches(entry.old)
        if entry.type == "MODIFIED":
            if now and not before:
                return {"type": "ADDED", "object": entry.obj}
            if before and not now:
                return {"type": "DELETED", "object": entry.obj}
        return {"type": entry.type, "object": entry.obj} if now else None
