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

import re
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
REVISION_LABEL = "controller-revision-hash"  # the StatefulSet controller's: the revision a pod was made from


class DiscoveryError(Exception):
    """The stack's pods cannot be turned into a participant list; the message says which pod."""


class StackRolling(DiscoveryError):
    """A StatefulSet of the stack is mid-rollout (or a pod of it is not ready): wait, then discover again."""


class ReplicaCountMismatch(DiscoveryError):
    """A StatefulSet runs another number of pods than its pods' replicas annotation says (scaled outside the chart)."""


def selector_string(
    match_labels: dict[str, str] | None,
    release: str,
    default: str | None = None,
    expressions: list[str] | None = None,
) -> str:
    """The label selector of a stack: the spec's ``matchLabels`` and ``matchExpressions`` (each already in
    selector form, e.g. ``tier in (a,b)``), else the operator's default (``GYMCKPT_PARTICIPANT_SELECTOR``);
    always only participant pods of the operator's release (``app.kubernetes.io/instance=<release>`` is
    added to any selector, so a spec cannot reach another release's pods: one naming another instance
    matches nothing)."""
    own = f"{INSTANCE_LABEL}={release}"
    expressions = list(expressions or [])
    if not match_labels and not expressions and default:
        parts = [default] + ([] if own in default.split(",") else [own])
    else:
        parts = [own] + [f"{k}={v}" for k, v in sorted((match_labels or {}).items()) if f"{k}={v}" != own] + expressions
    if PARTICIPANT_LABEL not in ",".join(parts).split(","):
        parts.append(PARTICIPANT_LABEL)  # only participant pods
    return ",".join(parts)


def _get(obj: Any, *path: str) -> Any:
    """Read a field from either a client model object or a plain dict (a pod as the API serves it in JSON)."""
    for key in path:
        if obj is None:
            return None
        if isinstance(obj, dict):
            obj = obj.get(key) if key in obj else obj.get(_camel(key))
        else:
            obj = getattr(obj, key, None)
    return obj


#: Kubernetes' JSON names that are not the camel case of the client's Python names (its models' attribute_map)
_JSON_NAMES = {"pod_ip": "podIP", "pod_ips": "podIPs", "host_ip": "hostIP", "host_ips": "hostIPs"}


def _camel(snake: str) -> str:
    """The JSON name Kubernetes gives a field the Python client calls ``snake``."""
    if snake in _JSON_NAMES:
        return _JSON_NAMES[snake]
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


def pod_replica(pod: Any) -> Replica | None:
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
            f"pod {name}: annotation {REPLICAS_ANNOTATION}={annotations[REPLICAS_ANNOTATION]!r} needs a StatefulSet "
            f"pod (ordinal {raw_ordinal!r}) of a server with that many replicas: {exc}"
        ) from None


def participants_from_pods(pods: list[Any], terminating_ok: bool = False) -> list[ParticipantRef]:
    """Every participant pod, or a clear error naming a pod that is not ready to take part. ``terminating_ok``: a
    pod that is being deleted takes part too (a final checkpoint is taken of pods that are going away: their servers
    hold their state through the grace period)."""
    refs: list[ParticipantRef] = []
    for pod in pods:
        name = _get(pod, "metadata", "name")
        labels = _get(pod, "metadata", "labels") or {}
        role = labels.get(ROLE_LABEL)
        if role not in ROLE_ORDER:
            raise DiscoveryError(
                f"pod {name}: label {ROLE_LABEL}={role!r} is not one of {[r.value for r in ROLE_ORDER]}"
            )
        if _get(pod, "metadata", "deletion_timestamp") and not terminating_ok:
            raise StackRolling(f"pod {name} is terminating")
        ip = _get(pod, "status", "pod_ip")
        phase = _get(pod, "status", "phase")
        if not ip or phase != "Running":
            raise StackRolling(f"pod {name} is not running yet (phase {phase}, ip {ip})")
        port = control_port(pod)
        if port is None:
            raise DiscoveryError(f"pod {name} has no {PORT_ANNOTATION} annotation and no port named http")
        refs.append(
            ParticipantRef(participant_id=name, role=Role(role), url=f"http://{ip}:{port}", replica=pod_replica(pod))
        )
    return sorted(refs, key=lambda r: (ROLE_ORDER.index(r.role), r.participant_id))


def statefulset_of(pod: Any) -> str | None:
    """The StatefulSet that owns the pod, if one does."""
    for owner in _get(pod, "metadata", "owner_references") or []:
        if _get(owner, "kind") == "StatefulSet":
            name = _get(owner, "name")
            return None if name is None else str(name)
    return None


def replicated_statefulsets(pods: list[Any]) -> list[str]:
    """The StatefulSets whose pods say how many replicas their server runs: their own count must agree."""
    return sorted(
        {
            sts
            for pod in pods
            if REPLICAS_ANNOTATION in (_get(pod, "metadata", "annotations") or {})
            and (sts := statefulset_of(pod)) is not None
        }
    )


def check_replica_counts(pods: list[Any], statefulsets: dict[str, int | None]) -> None:
    """Each pod's replicas annotation equals its StatefulSet's ``spec.replicas`` (``statefulsets``: name -> replicas,
    None when it is gone). They differ when the StatefulSet was scaled outside the chart (``kubectl scale``, an
    autoscaler) or while a ``helm upgrade`` changing the count rolls out: then which pods hold which rollouts is not
    what the pods say, and a checkpoint or restore is refused, naming the server and both counts."""
    problems: dict[str, str] = {}
    for pod in pods:
        annotations = _get(pod, "metadata", "annotations") or {}
        sts = statefulset_of(pod)
        if REPLICAS_ANNOTATION not in annotations or sts is None or statefulsets.get(sts) is None or sts in problems:
            continue
        said, runs = str(annotations[REPLICAS_ANNOTATION]), statefulsets[sts]
        if said != str(runs):
            server = (_get(pod, "metadata", "labels") or {}).get(PARTICIPANT_LABEL, sts)
            problems[sts] = (
                f"{server}: StatefulSet {sts} has replicas {runs} but its pod {_get(pod, 'metadata', 'name')} "
                f"says {said} ({REPLICAS_ANNOTATION})"
            )
    if problems:
        raise ReplicaCountMismatch(
            "replica counts disagree: "
            + "; ".join(problems[k] for k in sorted(problems))
            + ". Each replica holds the rollouts whose ids hash to its ordinal among that many replicas, so scale a "
            "server only through the chart (helm upgrade with servers[].replicas), or scale the StatefulSet back; "
            "if a helm upgrade is rolling out, wait until every pod is replaced and try again"
        )


# --- label selectors, and whether the stack's StatefulSets have settled ---------------------------------------

_SET_TERM = re.compile(r"^\s*(!?)([^\s!=(),]+)\s*(?:(in|notin)\s*\(([^)]*)\)|(==|=|!=)\s*([^\s,]*))?\s*$")


def _terms(selector: str) -> list[str]:
    """A selector's requirements: split on the commas outside parentheses (``k in (a,b)`` is one)."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t for t in terms if t.strip()]


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether ``labels`` satisfy a label selector string (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
    ``k in (a,b)``, ``k notin (a,b)``), as the API server evaluates it."""
    for term in _terms(selector):
        match = _SET_TERM.match(term)
        if match is None:
            raise DiscoveryError(f"label selector {selector!r}: cannot read {term.strip()!r}")
        negated, key, set_op, values, op, value = match.groups()
        if set_op:
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            ok = labels.get(key) in allowed if set_op == "in" else labels.get(key) not in allowed
        elif op:
            ok = labels.get(key) == value if op in ("=", "==") else labels.get(key) != value
        else:
            ok = (key in labels) != bool(negated)
        if not ok:
            return False
    return True


def template_labels(sts: Any) -> dict[str, str]:
    return dict(_get(sts, "spec", "template", "metadata", "labels") or {})


def rollout_problems(statefulsets: list[Any], pods: list[Any]) -> list[str]:
    """Why the stack's StatefulSets have not settled, one line each (empty: settled). ``statefulsets`` are those
    whose pod template the stack's selector matches (a StatefulSet mid-rollout may have no pod at all for a
    moment), ``pods`` the pods it matches. Settled, as ``kubectl rollout status`` has it: the controller has seen
    the latest spec; a RollingUpdate has every pod (above its partition) at the update revision; every replica is
    ready; and no pod of it is terminating or made from an older revision. A transaction then runs on exactly the
    new pods: a restore after ``helm upgrade`` never goes into a pod that is about to be replaced."""
    problems: list[str] = []
    for sts in sorted(statefulsets, key=lambda s: str(_get(s, "metadata", "name"))):
        name = _get(sts, "metadata", "name")
        generation = _get(sts, "metadata", "generation")
        observed = _get(sts, "status", "observed_generation")
        replicas = _get(sts, "spec", "replicas")
        replicas = 1 if replicas is None else int(replicas)
        if generation is not None and (observed is None or int(observed) < int(generation)):
            problems.append(f"StatefulSet {name}: its controller has not acted on generation {generation} yet")
            continue
        update_revision = _get(sts, "status", "update_revision")
        current_revision = _get(sts, "status", "current_revision")
        strategy = _get(sts, "spec", "update_strategy", "type") or "RollingUpdate"
        partition = int(_get(sts, "spec", "update_strategy", "rolling_update", "partition") or 0)
        if strategy == "RollingUpdate":
            updated = int(_get(sts, "status", "updated_replicas") or 0)
            if updated < replicas - partition or (partition == 0 and current_revision != update_revision):
                problems.append(
                    f"StatefulSet {name}: rolling out revision {update_revision}, {updated} of {replicas} pods updated"
                )
                continue
        ready = int(_get(sts, "status", "ready_replicas") or 0)
        if ready < replicas:
            problems.append(f"StatefulSet {name}: {ready} of {replicas} pods ready")
            continue
        owned = [pod for pod in pods if statefulset_of(pod) == name]
        for pod in owned:
            pod_name = _get(pod, "metadata", "name")
            revision = (_get(pod, "metadata", "labels") or {}).get(REVISION_LABEL)
            if _get(pod, "metadata", "deletion_timestamp"):
                problems.append(f"StatefulSet {name}: pod {pod_name} is terminating")
                break
            if (
                strategy == "RollingUpdate"
                and not partition
                and revision
                and update_revision
                and revision != update_revision
            ):
                problems.append(f"StatefulSet {name}: pod {pod_name} is still at revision {revision}")
                break
        else:
            if len(owned) < replicas:
                problems.append(f"StatefulSet {name}: {len(owned)} of {replicas} pods exist")
    return problems
