"""Finding participants: pods of the release with role and participant labels (``docs/protocol.md``, "Kubernetes").

A participant pod carries:
- label ``gym-checkpoint.dev/role`` (controller, environment, model, agent, resources),
- label ``gym-checkpoint.dev/participant`` (its server name),
- annotation ``gym-checkpoint.dev/control-port`` (or a container port named ``http``),
- its pod IP; the participant id is the pod name (the StatefulSet keeps it across restarts);
- annotation ``gym-checkpoint.dev/replicas`` (the chart sets it): how many pods its server runs. With it,
  the pod is replica ``<ordinal>`` of the server named by its participant label, the ordinal being the
  StatefulSet's (label ``apps.kubernetes.io/pod-index``, else the pod name's ``-<n>`` suffix); the
  coordinator then refuses a checkpoint missing an ordinal and a restore with other replica counts.
"""

from __future__ import annotations

from typing import Any

from gym_services.control.models import Replica
from gym_services.control.protocol import ROLE_ORDER, Role
from gym_services.coordination.client import ParticipantRef

ROLE_LABEL = "gym-checkpoint.dev/role"
PARTICIPANT_LABEL = "gym-checkpoint.dev/participant"
PORT_ANNOTATION = "gym-checkpoint.dev/control-port"
REPLICAS_ANNOTATION = "gym-checkpoint.dev/replicas"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
INSTANCE_LABEL = "app.kubernetes.io/instance"


class DiscoveryError(Exception):
    """The stack's pods cannot be turned into a participant list; the message says which pod."""


def selector_string(
    match_labels: dict[str, str] | None,
    release: str | None,
    default: str | None = None,
    expressions: list[str] | None = None,
) -> str:
    """The label selector of a stack: the spec's ``matchLabels`` and ``matchExpressions`` (each already in
    selector form, e.g. ``tier in (a,b)``), else the operator's default (``GYMCKPT_PARTICIPANT_SELECTOR``),
    else its release; always only participant pods."""
    labels = dict(match_labels or {})
    expressions = list(expressions or [])
    if not labels and not expressions and default:
        return default if PARTICIPANT_LABEL in default else f"{default},{PARTICIPANT_LABEL}"
    if not labels and not expressions and release:
        labels[INSTANCE_LABEL] = release
    parts = [f"{k}={v}" for k, v in sorted(labels.items())] + expressions
    parts.append(PARTICIPANT_LABEL)  # only participant pods
    return ",".join(parts)


def _get(obj: Any, *path: str) -> Any:
    """Read a field from either a client model object or a plain dict."""
    for key in path:
        if obj is None:
            return None
        if isinstance(obj, dict):
            obj = obj.get(key) if key in obj else obj.get(_camel(key))
        else:
            obj = getattr(obj, key, None)
    return obj


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def control_port(pod: Any) -> int | None:
    annotations = _get(pod, "metadata", "annotations") or {}
    if PORT_ANNOTATION in annotations:
        try:
            return int(annotations[PORT_ANNOTATION])
        except ValueError:
            raise DiscoveryError(
                f"pod {_get(pod, 'metadata', 'name')}: annotation {PORT_ANNOTATION} is not a port number"
            ) from None
    for container in _get(pod, "spec", "containers") or []:
        for port in _get(container, "ports") or []:
            if _get(port, "name") == "http":
                return int(_get(port, "container_port"))
    return None


def replica_of(pod: Any) -> Replica | None:
    """Which replica of its server the pod is, when its server says how many it runs."""
    name = _get(pod, "metadata", "name")
    annotations = _get(pod, "metadata", "annotations") or {}
    labels = _get(pod, "metadata", "labels") or {}
    if REPLICAS_ANNOTATION not in annotations:
        return None
    raw_ordinal = labels.get(POD_INDEX_LABEL) or str(name).rsplit("-", 1)[-1]
    try:
        count, ordinal = int(annotations[REPLICAS_ANNOTATION]), int(raw_ordinal)
        return Replica(group=labels[PARTICIPANT_LABEL], ordinal=ordinal, replicas=count)
    except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise DiscoveryError(
            f"pod {name}: annotation {REPLICAS_ANNOTATION}={annotations[REPLICAS_ANNOTATION]!r} needs a StatefulSet pod "
            f"(ordinal {raw_ordinal!r}) of a server with that many replicas: {exc}"
        ) from None


def participants_from_pods(pods: list[Any]) -> list[ParticipantRef]:
    """Every participant pod, or a clear error naming a pod that is not ready to take part."""
    refs: list[ParticipantRef] = []
    for pod in pods:
        name = _get(pod, "metadata", "name")
        labels = _get(pod, "metadata", "labels") or {}
        role = labels.get(ROLE_LABEL)
        if role not in ROLE_ORDER:
            raise DiscoveryError(f"pod {name}: label {ROLE_LABEL}={role!r} is not one of {[r.value for r in ROLE_ORDER]}")
        if _get(pod, "metadata", "deletion_timestamp"):
            raise DiscoveryError(f"pod {name} is terminating")
        ip = _get(pod, "status", "pod_ip")
        phase = _get(pod, "status", "phase")
        if not ip or phase != "Running":
            raise DiscoveryError(f"pod {name} is not running yet (phase {phase}, ip {ip})")
        port = control_port(pod)
        if port is None:
            raise DiscoveryError(f"pod {name} has no {PORT_ANNOTATION} annotation and no port named http")
        refs.append(ParticipantRef(participant_id=name, role=Role(role), url=f"http://{ip}:{port}", replica=replica_of(pod)))
    return sorted(refs, key=lambda r: (ROLE_ORDER.index(r.role), r.participant_id))
