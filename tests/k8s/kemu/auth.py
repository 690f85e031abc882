"""Authentication and RBAC authorization, as kube-apiserver's filters do them.

Authentication (bearer tokens, as kubectl, kopf and the kubernetes client send them):
- `kemu-test-token` is the test harness's admin: user `kemu-admin` in group `system:masters`;
- ServiceAccount tokens are JWTs the emulator issues through the TokenRequest API
  (`POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`, i.e. `kubectl create token NAME`) or into
  `kubernetes.io/service-account-token` Secrets; they authenticate as
  `system:serviceaccount:NS:NAME` in `system:serviceaccounts`, `system:serviceaccounts:NS` and
  `system:authenticated`, while the ServiceAccount still exists with the token's uid;
- no token: `system:anonymous` in `system:unauthenticated`; a token that does not verify: 401.

Authorization (the RBAC authorizer, k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac): the request's
verb (get/list/watch/create/update/patch/delete/deletecollection), API group, resource, subresource,
name and namespace, or a non-resource path, are matched against the rules of the Roles and ClusterRoles
that RoleBindings (in the request's namespace) and ClusterRoleBindings grant the user, its groups or its
ServiceAccount; aggregated ClusterRoles collect the rules of the ClusterRoles their selectors match.
`system:masters` may do everything. The bootstrap roles a real cluster has for discovery
(`system:discovery`, `system:basic-user`, `system:public-info-viewer`, `cluster-admin`) are installed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

ADMIN_TOKEN = "kemu-test-token"
ADMIN_USER = "kemu-admin"
ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = "https://kubernetes.default.svc.cluster.local"
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, compare=False, hash=False)

    def as_user_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            info["uid"] = self.uid
        if self.extra:
            info["extra"] = self.extra
        return info


ADMIN = User(ADMIN_USER, ("system:masters", "system:authenticated"))
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """What the authorizer decides on (authorizer.Attributes)."""

    user: User
    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenAuthority:
    """Issues and verifies ServiceAccount tokens (JWT, HS256 with a key private to this emulator)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def issue(
        self,
        namespace: str,
        name: str,
        sa_uid: str,
        audiences: list[str] | None = None,
        seconds: int | None = 3600,
        secret_name: str = "",
    ) -> tuple[str, int | None]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{namespace}:{name}",
            "aud": audiences or [AUDIENCE],
            "iat": now,
            "nbf": now,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": sa_uid}},
        }
        expires = now + seconds if seconds else None
        if expires:
            claims["exp"] = expires
        if secret_name:
            claims["kubernetes.io"]["secret"] = {"name": secret_name}
        header = _b64(json.dumps({"alg": "HS256", "kid": "kemu", "typ": "JWT"}).encode())
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signature = _b64(hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256).digest())
        return f"{header}.{payload}.{signature}", expires

    def verify(self, token: str) -> dict[str, Any] | None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        expected = _b64(hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[2]):
            return None
        try:
            claims = json.loads(_unb64(parts[1]))
        except ValueError:
            return None
        if claims.get("exp") and claims["exp"] < time.time():
            return None
        return claims


def service_account_user(namespace: str, name: str, uid: str = "") -> User:
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        uid,
    )


class Unauthenticated(Exception):
    pass


def authenticate(
    header: str | None, authority: TokenAuthority, service_account_uid: Callable[[str, str], str | None]
) -> User:
    """The request's user; Unauthenticated (401) for a bearer token that does not verify."""
    if not header:
        return ANONYMOUS
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated()
    token = token.strip()
    if token == ADMIN_TOKEN:
        return ADMIN
    claims = authority.verify(token)
    if claims is None:
        raise Unauthenticated()
    info = claims.get("kubernetes.io") or {}
    namespace, name = info.get("namespace", ""), (info.get("serviceaccount") or {}).get("name", "")
    uid = (info.get("serviceaccount") or {}).get("uid", "")
    if service_account_uid(namespace, name) != uid:
        raise Unauthenticated()  # the ServiceAccount was deleted (or recreated): its tokens die with it
    return service_account_user(namespace, name, uid)


# ---- RBAC ----

BOOTSTRAP_CLUSTER_ROLES: list[dict[str, Any]] = [
    {
        "metadata": {"name": "cluster-admin"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    },
    {
        "metadata": {"name": "system:discovery"},
        "rules": [
            {
                "nonResourceURLs": [
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                "verbs": ["get"],
            }
        ],
    },
    {
        "metadata": {"name": "system:public-info-viewer"},
        "rules": [{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}],
    },
    {
        "metadata": {"name": "system:basic-user"},
        "rules": [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            },
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
        ],
    },
]
BOOTSTRAP_CLUSTER_ROLE_BINDINGS: list[dict[str, Any]] = [
    {
        "metadata": {"name": "cluster-admin"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:masters"}],
    },
    {
        "metadata": {"name": "system:discovery"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:discovery"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:authenticated"}],
    },
    {
        "metadata": {"name": "system:public-info-viewer"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:public-info-viewer"},
        "subjects": [
            {"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:authenticated"},
            {"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:unauthenticated"},
        ],
    },
    {
        "metadata": {"name": "system:basic-user"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:basic-user"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:authenticated"}],
    },
]


def _subject_matches(subject: dict[str, Any], user: User, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _matches(patterns: Iterable[str], value: str) -> bool:
    patterns = list(patterns)
    return "*" in patterns or value in patterns


def _resource_matches(rule_resources: list[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for item in rule_resources:
        if item == "*" or item == combined:
            return True
        if subresource and item == f"*/{subresource}":
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    """rbac.RuleAllows."""
    if not _matches(rule.get("verbs") or [], attrs.verb):
        return False
    if not attrs.resource_request:
        for url in rule.get("nonResourceURLs") or []:
            if url == "*" or url == attrs.path or (url.endswith("*") and attrs.path.startswith(url[:-1])):
                return True
        return False
    if rule.get("nonResourceURLs") and not rule.get("resources"):
        return False
    if not _matches(rule.get("apiGroups") or [], attrs.api_group):
        return False
    if not _resource_matches(rule.get("resources") or [], attrs.resource, attrs.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


class Authorizer:
    """RBAC over the Roles, ClusterRoles and bindings stored in the emulator."""

    def __init__(self, objects: Callable[[str, str | None], list[dict[str, Any]]]) -> None:
        self._objects = objects  # (plural, namespace or None) -> live objects of rbac.authorization.k8s.io/v1

    def _cluster_role_rules(self, name: str, problems: list[str]) -> list[dict[str, Any]]:
        roles = {role["metadata"]["name"]: role for role in self._objects("clusterroles", None)}
        role = roles.get(name)
        if role is None:
            problems.append(f'clusterrole.rbac.authorization.k8s.io "{name}" not found')
            return []
        rules = list(role.get("rules") or [])
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
            wanted = selector.get("matchLabels") or {}
            for other in roles.values():
                labels = other["metadata"].get("labels") or {}
                if other is not role and wanted and all(labels.get(k) == v for k, v in wanted.items()):
                    rules.extend(other.get("rules") or [])
        return rules

    def _role_rules(self, ref: dict[str, Any], namespace: str, problems: list[str]) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            return self._cluster_role_rules(ref.get("name", ""), problems)
        for role in self._objects("roles", namespace):
            if role["metadata"]["name"] == ref.get("name"):
                return list(role.get("rules") or [])
        problems.append(f'role.rbac.authorization.k8s.io "{ref.get("name")}" not found')
        return []

    def rules_for(self, user: User, namespace: str) -> tuple[list[dict[str, Any]], list[str]]:
        problems: list[str] = []
        rules: list[dict[str, Any]] = []
        for binding in self._objects("clusterrolebindings", None):
            if any(_subject_matches(s, user, "") for s in binding.get("subjects") or []):
                rules.extend(self._cluster_role_rules((binding.get("roleRef") or {}).get("name", ""), problems))
        if namespace:
            for binding in self._objects("rolebindings", namespace):
                if any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
                    rules.extend(self._role_rules(binding.get("roleRef") or {}, namespace, problems))
        return rules, problems

    def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason); the reason names bindings whose role is missing, as RBAC's does."""
        if "system:masters" in attrs.user.groups:
            return True, ""
        rules, problems = self.rules_for(attrs.user, attrs.namespace)
        if any(rule_allows(rule, attrs) for rule in rules):
            return True, ""
        return False, ("RBAC: " + ", ".join(problems)) if problems else ""


def forbidden_message(attrs: Attributes) -> str:
    """responsewriters.forbiddenMessage."""
    if not attrs.resource_request:
        return f'User "{attrs.user.name}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if attrs.namespace:
        return (
            f'User "{attrs.user.name}" cannot {attrs.verb} resource "{resource}" in API group '
            f'"{attrs.api_group}" in the namespace "{attrs.namespace}"'
        )
    return (
        f'User "{attrs.user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" '
        f"at the cluster scope"
    )


def request_verb(method: str, has_name: bool, watch: bool) -> str:
    """The authorizer verb of an HTTP request (RequestInfoFactory)."""
    method = method.upper()
    if method == "GET" or method == "HEAD":
        if watch:
            return "watch"
        return "get" if has_name else "list"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if has_name else "deletecollection",
    }.get(method, method.lower())
