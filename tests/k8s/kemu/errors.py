"""Canonical Kubernetes `Status` errors.

Clients branch on `reason` (kubectl 1.20 apply needs `NotFound`, Helm needs `AlreadyExists` and
`Conflict`), so the emulator answers with the same reasons and message shapes as kube-apiserver.
"""

from __future__ import annotations

from typing import Any

import aiohttp.web


class KemuError(Exception):
    """An API error rendered as a `v1/Status` body."""

    def __init__(self, status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details

    def as_status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.status,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.json_response(self.as_status(), status=self.status)


def qualified(group: str, plural: str) -> str:
    """`checkpoints.gym-checkpoint.dev`, or just `configmaps` for the core group."""
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> KemuError:
    return KemuError(
        404,
        "NotFound",
        f'{qualified(group, plural)} "{name}" not found',
        {"name": name, "group": group, "kind": plural},
    )


def resource_not_found() -> KemuError:
    return KemuError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(group: str, plural: str, name: str) -> KemuError:
    return KemuError(
        409,
        "AlreadyExists",
        f'{qualified(group, plural)} "{name}" already exists',
        {"name": name, "group": group, "kind": plural},
    )


def conflict(group: str, plural: str, name: str, why: str) -> KemuError:
    return KemuError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {why}',
        {"name": name, "group": group, "kind": plural},
    )


def bad_request(message: str) -> KemuError:
    return KemuError(400, "BadRequest", message)


def invalid(group: str, kind: str, name: str, message: str) -> KemuError:
    return KemuError(
        422,
        "Invalid",
        f'{kind}{"." + group if group else ""} "{name}" is invalid: {message}',
        {"name": name, "group": group, "kind": kind},
    )


def method_not_allowed(message: str) -> KemuError:
    return KemuError(405, "MethodNotAllowed", message)


def unsupported_media_type(message: str) -> KemuError:
    return KemuError(415, "UnsupportedMediaType", message)


def expired(message: str) -> KemuError:
    return KemuError(410, "Expired", message)


def invalid_fields(group: str, kind: str, name: str, field_errors: list[Any]) -> KemuError:
    """apierrors.NewInvalid: 422, reason Invalid, one `details.causes` entry per field error."""
    from .fielderrors import aggregate, go_quote

    qualified = f"{kind}.{group}" if group else kind
    message = f"{qualified} {go_quote(name)} is invalid"
    if field_errors:
        message += f": {aggregate(field_errors)}"
    details: dict[str, Any] = {key: value for key, value in (("name", name), ("group", group), ("kind", kind)) if value}
    details["causes"] = [error.cause() for error in field_errors]
    return KemuError(422, "Invalid", message, details)


def forbidden(group: str, resource: str, name: str, why: str) -> KemuError:
    """apierrors.NewForbidden as the authorization filter builds it."""
    from .fielderrors import go_quote

    qualified = f"{resource}.{group}" if group else resource
    if not qualified:
        message = f"forbidden: {why}"
    elif not name:
        message = f"{qualified} is forbidden: {why}"
    else:
        message = f"{qualified} {go_quote(name)} is forbidden: {why}"
    details = {key: value for key, value in (("name", name), ("group", group), ("kind", resource)) if value}
    return KemuError(403, "Forbidden", message, details)


def unauthorized() -> KemuError:
    return KemuError(401, "Unauthorized", "Unauthorized")
