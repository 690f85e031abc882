"""``gymckpt cluster checkpoint|restore|secret``: create a Checkpoint or Restore resource and wait for its end;
create a release's generated Secret once.

The same as ``kubectl apply`` + ``kubectl wait``, for a desk or an image without kubectl (a ``helm upgrade`` needs
neither: the operator takes the termination checkpoint and the automatic restore,
``docs/operations/kubernetes-preemption.md``). The operator does the work; this only creates the resource and follows
its ``status`` (progress on stderr). Exit 0 when Completed, 1 when Failed or out of time, 2 on bad usage.
``secret`` is the chart's secrets hook: it creates a Secret of random values once and adds a key it lacks, but
never changes a value it holds, so a GitOps tool that renders the chart offline never rotates a token.
Needs the ``kubernetes`` package (the ``operator`` extra; in the image).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GROUP, VERSION = "gym-checkpoint.dev", "v1alpha1"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
FINAL = ("Completed", "Failed")


class ClusterError(RuntimeError):
    """The resource could not be created or followed; the message says why."""


def _api() -> tuple[Any, Any, Any]:
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ClusterError("needs the kubernetes package: pip install 'gym-checkpoint[operator]'") from None
    try:
        config.load_config()  # $KUBECONFIG or ~/.kube/config, else the pod's service account
    except ConfigException as exc:
        raise ClusterError(f"no Kubernetes credentials: {exc}") from None
    return client.CustomObjectsApi(), client.CoreV1Api(), client.AppsV1Api()


def _namespace(given: str | None) -> str:
    if given:
        return given
    if IN_CLUSTER_NAMESPACE.exists():
        return IN_CLUSTER_NAMESPACE.read_text().strip()
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts()
        return active.get("context", {}).get("namespace") or "default"
    except Exception:
        return "default"


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _create(custom: Any, namespace: str, plural: str, body: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as exc:
        if exc.status == 409:
            _say(f"{body['kind']} {body['metadata']['name']} exists already: following it")
            return
        raise ClusterError(
            f"creating {body['kind']} {body['metadata']['name']} failed: {exc.status} {exc.reason}: "
            f"{(exc.body or '')[:300]}"
        ) from None


def _follow(custom: Any, namespace: str, plural: str, name: str, timeout_s: float) -> dict[str, Any]:
    """Poll the resource's status until Completed or Failed (or the deadline); phase changes on stderr."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    phase = None
    while True:
        try:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as exc:
            raise ClusterError(f"reading {plural}/{name} failed: {exc.status} {exc.reason}") from None
        status = obj.get("status") or {}
        if status.get("phase") != phase:
            phase = status.get("phase")
            _say(
                f"{plural[:-1]} {name}: {phase or 'waiting for the operator'}"
                + (f" ({status['message']})" if status.get("message") else "")
            )
        if phase in FINAL:
            return status
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{plural}/{name} is still {phase or 'unhandled (is the operator running?)'} after {timeout_s:.0f}s"
            )
        time.sleep(1.0)


def _summary(kind: str, name: str, status: dict[str, Any]) -> str:
    lines = [f"{kind} {name}: {status.get('phase')}" + (f" ({status.get('reason')})" if status.get("reason") else "")]
    if status.get("message"):
        lines.append(f"  {status['message']}")
    for blocker in status.get("blockers") or []:
        lines.append(
            f"  blocked by {blocker.get('participant')}: {blocker.get('kind')} {blocker.get('id', '')} "
            f"{blocker.get('detail', '')}".rstrip()
        )
    for key in ("checkpointId", "location", "participantCount", "pauseSeconds", "restoredEpisodes", "attempt"):
        if key in status:
            lines.append(f"  {key}: {status[key]}")
    return "\n".join(lines)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ClusterError(f"--label takes KEY=VALUE, got {pair!r}")
        labels[key] = value
    return labels


def _release(given: str | None) -> str:
    release = given or os.environ.get("GYMCKPT_RELEASE", "")
    if not release:
        raise ClusterError("--release is required: the Helm release whose operator runs it (or set $GYMCKPT_RELEASE)")
    return release


def _run(work: Callable[[], int]) -> int:
    try:
        return work()
    except ClusterError as exc:
        print(f"gymckpt cluster: {exc}", file=sys.stderr)
        return 1


def cmd_checkpoint(args: argparse.Namespace) -> int:
    def work() -> int:
        custom, _, _ = _api()
        namespace = _namespace(args.namespace)
        name = args.name or f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}"
        spec: dict[str, Any] = {
            "release": _release(args.release),
            "prepareTimeoutSeconds": args.prepare_timeout,
            "leaseSeconds": args.lease,
        }
        if args.storage_location:
            spec["storageLocation"] = args.storage_location
        if args.deletion_policy:
            spec["deletionPolicy"] = args.deletion_policy
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Checkpoint",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        _create(custom, namespace, "checkpoints", body)
        if args.no_wait:
            print(f"Checkpoint {name} created in {namespace}")
            return 0
        status = _follow(custom, namespace, "checkpoints", name, args.wait_timeout)
        print(json.dumps(status, indent=1) if args.json else _summary("Checkpoint", name, status))
        return 0 if status.get("phase") == "Completed" else 1

    return _run(work)


def cmd_restore(args: argparse.Namespace) -> int:
    def work() -> int:
        release = _release(args.release)
        custom, _, _ = _api()
        namespace = _namespace(args.namespace)
        name = args.name or f"restore-{args.checkpoint}"
        _require_completed(custom, namespace, args.checkpoint)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Restore",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"release": release, "checkpointRef": {"name": args.checkpoint}, "leaseSeconds": args.lease},
        }
        _create(custom, namespace, "restores", body)
        if args.no_wait:
            print(f"Restore {name} created in {namespace}")
            return 0
        status = _follow(custom, namespace, "restores", name, args.wait_timeout)
        print(json.dumps(status, indent=1) if args.json else _summary("Restore", name, status))
        return 0 if status.get("phase") == "Completed" else 1

    return _run(work)


def _require_completed(custom: Any, namespace: str, checkpoint: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "checkpoints", checkpoint)
    except ApiException as exc:
        raise ClusterError(f"Checkpoint {checkpoint} in {namespace}: {exc.status} {exc.reason}") from None
    phase = (obj.get("status") or {}).get("phase")
    if phase != "Completed":
        raise ClusterError(
            f"Checkpoint {checkpoint} is {phase or 'not handled yet'}, not Completed: nothing to restore"
        )


SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
ALPHABET = string.ascii_letters + string.digits


def _secret_keys(pairs: list[str]) -> dict[str, int]:
    keys: dict[str, int] = {}
    for pair in pairs:
        key, sep, length = pair.partition("=")
        if not sep or not SECRET_KEY.fullmatch(key) or not length.isdigit() or not 16 <= int(length) <= 256:
            raise ClusterError(f"--key takes KEY=LENGTH (a Secret key, 16 to 256 characters), got {pair!r}")
        keys[key] = int(length)
    if not keys:
        raise ClusterError("give at least one --key KEY=LENGTH")
    return keys


def _read_secret(core: Any, namespace: str, name: str) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise ClusterError(f"reading Secret {name} in {namespace} failed: {exc.status} {exc.reason}") from None


def _fill_secret(
    core: Any, namespace: str, name: str, keys: dict[str, int], seeds: list[str], labels: dict[str, str]
) -> str:
    """One attempt: create the Secret, or add the keys it lacks. Returns what it did; raises _Conflict when
    another writer got there first."""
    from kubernetes.client.exceptions import ApiException

    existing = _read_secret(core, namespace, name)
    data = dict((existing.data or {}) if existing is not None else {})
    missing = [key for key in keys if key not in data]
    if not missing:
        return f"Secret {name} holds {', '.join(keys)} already: unchanged"
    values: dict[str, str] = {}
    for seed in seeds:  # values an earlier chart version rendered itself: kept, not rotated
        old = _read_secret(core, namespace, seed)
        for key in missing:
            if old is not None and key in (old.data or {}) and key not in values:
                values[key] = old.data[key]
    seeded = sorted(values)
    for key in missing:
        if key not in values:
            values[key] = base64.b64encode(
                "".join(secrets.choice(ALPHABET) for _ in range(keys[key])).encode()
            ).decode()
    try:
        if existing is None:
            body = {"metadata": {"name": name, "labels": labels}, "type": "Opaque", "data": values}
            core.create_namespaced_secret(namespace, body)
        else:  # the resourceVersion makes a concurrent change a conflict instead of a lost update
            patch = {"metadata": {"resourceVersion": existing.metadata.resource_version}, "data": values}
            core.patch_namespaced_secret(name, namespace, patch)
    except ApiException as exc:
        if exc.status == 409:
            raise _Conflict from None
        raise ClusterError(f"writing Secret {name} in {namespace} failed: {exc.status} {exc.reason}") from None
    verb = "created with" if existing is None else "given"
    kept = f" ({', '.join(seeded)} kept from {', '.join(seeds)})" if seeded else ""
    return f"Secret {name} {verb} {', '.join(missing)}{kept}"


def _take_keys(core: Any, namespace: str, source: str, keys: list[str]) -> str:
    """Remove ``keys`` from the Secret ``source`` (they were moved: the Secret they went to holds them now)."""
    from kubernetes.client.exceptions import ApiException

    found = _read_secret(core, namespace, source)
    present = sorted(k for k in keys if found is not None and k in (found.data or {}))
    if not present:
        return f"Secret {source} holds none of {', '.join(keys)}: unchanged"
    patch = {"metadata": {"resourceVersion": found.metadata.resource_version}, "data": dict.fromkeys(present)}
    try:
        core.patch_namespaced_secret(source, namespace, patch)
    except ApiException as exc:
        if exc.status == 409:
            raise _Conflict from None
        raise ClusterError(
            f"removing {', '.join(present)} from Secret {source} failed: {exc.status} {exc.reason}"
        ) from None
    return f"Secret {source}: {', '.join(present)} moved out"


class _Conflict(Exception):
    pass


def cmd_secret(args: argparse.Namespace) -> int:
    def work() -> int:
        from kubernetes.client.exceptions import ApiException

        _, core, apps = _api()
        namespace = _namespace(args.namespace)
        if args.delete:
            if args.unless_used_by:
                users = [
                    f"{kind} {item.metadata.name}"
                    for kind, found in (
                        (
                            "StatefulSet",
                            apps.list_namespaced_stateful_set(namespace, label_selector=args.unless_used_by),
                        ),
                        ("Deployment", apps.list_namespaced_deployment(namespace, label_selector=args.unless_used_by)),
                    )
                    for item in found.items
                ]
                if users:
                    print(f"Secret {args.name} kept: {', '.join(users)} still run ({args.unless_used_by})")
                    return 0
            try:
                core.delete_namespaced_secret(args.name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise ClusterError(f"deleting Secret {args.name} failed: {exc.status} {exc.reason}") from None
            print(f"Secret {args.name} deleted from {namespace}")
            return 0
        keys, labels = _secret_keys(args.key), _labels(args.label)
        for _ in range(5):  # bounded: each round loses only to another writer's success
            try:
                print(_fill_secret(core, namespace, args.name, keys, args.move_from + args.seed_from, labels))
                for source in args.move_from:
                    print(_take_keys(core, namespace, source, list(keys)))
                return 0
            except _Conflict:
                time.sleep(0.2)
        raise ClusterError(f"Secret {args.name} kept changing underneath: run it again")

    return _run(work)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cluster",
        help="create a Checkpoint or Restore resource on Kubernetes and wait for it",
        description="Create a Checkpoint or Restore resource (the operator runs it) and follow its status until it "
        "is Completed (exit 0) or Failed (exit 1). Credentials: $KUBECONFIG, ~/.kube/config, "
        "or a pod's service account.",
    )
    inner = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    _register_checkpoint(inner)
    _register_restore(inner)
    _register_secret(inner)


def _common(q: argparse.ArgumentParser) -> None:
    """What ``cluster checkpoint`` and ``cluster restore`` both take."""
    q.add_argument("--namespace", "-n", help="namespace (default: the kubeconfig's, or the pod's)")
    q.add_argument("--release", help="the Helm release whose operator runs it (default: $GYMCKPT_RELEASE)")
    q.add_argument("--lease", type=int, default=60, help="lease seconds (default 60)")
    q.add_argument("--wait-timeout", type=float, default=900.0, help="seconds to wait for the end (default 900)")
    q.add_argument("--no-wait", action="store_true", help="create the resource and return")
    q.add_argument("--json", action="store_true", help="print the final status as JSON")


def _register_checkpoint(inner: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = inner.add_parser(
        "checkpoint",
        help="create a Checkpoint and wait until it is Completed or Failed",
        description="Create a Checkpoint of the release's stack and wait for its end.",
    )
    q.add_argument("name", nargs="?", help="resource name (default ckpt-TIMESTAMP)")
    q.add_argument(
        "--prepare-timeout", type=int, default=300, help="seconds for every server to reach a boundary (default 300)"
    )
    q.add_argument(
        "--storage-location",
        metavar="NAME",
        help="a storage location the admin defined (default: default, the release's storage)",
    )
    q.add_argument(
        "--deletion-policy",
        choices=("Retain", "Delete"),
        help="what deleting the Checkpoint does to its stored objects (default: the CRD's, Retain)",
    )
    _common(q)
    q.set_defaults(func=cmd_checkpoint)


def _register_restore(inner: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = inner.add_parser(
        "restore",
        help="create a Restore of a Checkpoint and wait until it is Completed or Failed",
        description="Create a Restore of a Checkpoint (after the pods were replaced) and wait for its end.",
    )
    q.add_argument("name", nargs="?", help="resource name (default restore-CHECKPOINT)")
    q.add_argument(
        "--from", dest="checkpoint", required=True, metavar="CHECKPOINT", help="the Checkpoint resource to restore"
    )
    _common(q)
    q.set_defaults(func=cmd_restore)


def _register_secret(inner: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = inner.add_parser(
        "secret",
        help="create a Secret of random values once (the chart's secrets hook); never change a value it holds",
        description="Create the Secret NAME with a random value (letters and digits) for each --key, or add the keys "
        "it lacks; a value it holds is never changed. --seed-from takes a value from an older Secret instead of a "
        "random one. --delete removes the Secret.",
    )
    q.add_argument("name", help="the Secret's name")
    q.add_argument("--namespace", "-n", help="namespace (default: the kubeconfig's, or the pod's)")
    q.add_argument("--key", action="append", default=[], metavar="KEY=LENGTH", help="a key and its length (repeatable)")
    q.add_argument(
        "--seed-from", action="append", default=[], metavar="SECRET", help="take a missing key's value from this Secret"
    )
    q.add_argument(
        "--move-from",
        action="append",
        default=[],
        metavar="SECRET",
        help="as --seed-from, then remove the keys from that Secret (a key that must live in this Secret alone)",
    )
    q.add_argument("--label", action="append", default=[], help="label KEY=VALUE on a created Secret (repeatable)")
    q.add_argument("--delete", action="store_true", help="delete the Secret instead (nothing if it is gone)")
    q.add_argument(
        "--unless-used-by",
        metavar="SELECTOR",
        help="with --delete: keep the Secret while a StatefulSet or Deployment matching this label selector exists",
    )
    q.set_defaults(func=cmd_secret)
