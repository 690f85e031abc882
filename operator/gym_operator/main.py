"""The operator's process (``gym-operator``): leader election first, then kopf with the handlers.

``gym-operator --namespace NS [--liveness URL] [--storage-gateway URL] [--log-format json|plain|full]
[--verbose|--quiet]``

``gym-operator --namespace NS --uninstall [--timeout S]`` is the chart's pre-delete hook instead
(:mod:`gym_operator.uninstall`): it makes the release's operator step down and lets go of the release's finalizers
before Helm deletes the operator's rights. ``gym-operator --namespace NS --apply-crds DIR`` is its pre-upgrade hook
(:mod:`gym_operator.crdupgrade`): the chart's CRDs applied before the new operator starts.

Every replica of a release's operator runs this. It first checks the installed CRDs (:mod:`gym_operator.crdcheck`):
a replica over CRDs older than itself never competes. Each is then a candidate for the release's leadership, its
Kubernetes Lease (:mod:`gym_operator.leadership`); only the holder starts kopf (:mod:`gym_operator.handlers`), so only
one operator ever coordinates a transaction. The others stand by. Every replica answers its probes
(:mod:`gym_operator.probes`: ``--liveness`` and ``/readyz`` on the same port) from its first second, standing by or
not, so the kubelet restarts a hung process, never a healthy standby, and a rollout waits for replicas that can work;
the same port serves ``GET /metrics`` (:mod:`gym_operator.metrics`). Every replica also serves the storage gateway at
``--storage-gateway`` (:mod:`gym_operator.gateway`; it needs ``GYMCKPT_GATEWAY_KEY``).

A leader whose Lease the pre-delete hook marks steps down: kopf stops (its cleanup takes the release's finalizers
off), the Lease is released, and the process stands by, answering its probe, until it is stopped.

Exit status: 0 stopped (SIGTERM/SIGINT; a leader releases its Lease first), 2 bad settings, 3 the Lease was
lost (:data:`gym_operator.leadership.EXIT_LOST`: stop acting at once, as client-go's leader election does; the
kubelet restarts the container, which then stands by).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import kopf
import urllib3
from kubernetes import client

import gym_operator.handlers  # noqa: F401  (registers the handlers with kopf; imported before the loop runs)
from gym_operator import crdupgrade, gateway, probes, uninstall
from gym_operator.kube import Kube, api_client
from gym_operator.leadership import EXIT_LOST, Leadership, LeadershipSettings
from gym_operator.specs import OperatorSettings, SpecError
from gym_services.base.config import StorageConfig
from gym_services.control.storage.gateway import GrantSigner

log = logging.getLogger("gym.operator")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gym-operator", description="Run the Gym Checkpoint operator of one release (leader-elected)"
    )
    p.add_argument("--namespace", required=True, help="the release's namespace (its resources, pods and Lease)")
    p.add_argument(
        "--liveness",
        metavar="URL",
        help="serve the liveness probe (and /metrics) here, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument(
        "--storage-gateway",
        metavar="URL",
        help="serve the storage gateway here, e.g. http://0.0.0.0:8081 (signs the servers' storage requests; needs "
        "GYMCKPT_GATEWAY_KEY)",
    )
    p.add_argument("--log-format", choices=["json", "plain", "full"], default="full", help="kopf's log format")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--verbose", action="store_true", help="debug logs")
    level.add_argument("--quiet", action="store_true", help="warnings and errors only")
    p.add_argument(
        "--uninstall",
        action="store_true",
        help="the chart's pre-delete hook: make the release's operator step down, then take the release's "
        "finalizers off its Checkpoints and Restores (GYMCKPT_RELEASE, GYMCKPT_LEADER_LEASE)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="with --uninstall: seconds to wait for the operator (default 60)"
    )
    p.add_argument(
        "--apply-crds",
        metavar="DIR",
        type=Path,
        help="the chart's pre-upgrade hook: create or replace the CRDs of the YAML files in DIR (never by older ones)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kopf.configure(verbose=args.verbose, quiet=args.quiet, log_format=kopf.LogFormat[args.log_format.upper()])
    if args.uninstall:
        return _uninstall(args)
    if args.apply_crds is not None:
        return crdupgrade.run(args.apply_crds)
    try:
        settings = OperatorSettings.from_env()  # refused here, before standing by for a leadership it could not use
        leadership = LeadershipSettings.from_env(args.namespace)
        if args.liveness:
            probes.endpoint(args.liveness)
        if args.storage_gateway:
            probes.endpoint(args.storage_gateway)
            if settings.gateway_key is None:
                raise ValueError("--storage-gateway needs GYMCKPT_GATEWAY_KEY (the key its grants are signed with)")
    except (SpecError, ValueError) as exc:
        print(f"gym-operator: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(args.namespace, leadership, args.liveness, args.storage_gateway, settings))


def _uninstall(args: argparse.Namespace) -> int:
    release = os.environ.get("GYMCKPT_RELEASE") or ""
    try:
        leadership = LeadershipSettings.from_env(args.namespace)
    except SpecError as exc:
        print(f"gym-operator: {exc}", file=sys.stderr)
        return 2
    if not release:
        print("gym-operator: GYMCKPT_RELEASE is not set: which release is being uninstalled?", file=sys.stderr)
        return 2
    deployment = os.environ.get("GYMCKPT_OPERATOR_DEPLOYMENT") or None
    return asyncio.run(uninstall.run(leadership, release, deployment, args.timeout))


def _lost(why: str) -> None:
    """The leadership is gone: stop acting now. No cleanup that could still talk to a server or the API."""
    log.critical(f"{why}; exiting so that only the new leader acts", extra={"leader": False})
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_LOST)


def _post_leader_event(api: client.ApiClient, leadership: LeadershipSettings) -> None:
    """A Normal Event ``LeaderElection`` on the Kubernetes Lease, as client-go's recorder posts (best effort)."""
    try:
        record = client.CoordinationV1Api(api).read_namespaced_lease(
            leadership.name, leadership.namespace, _request_timeout=10
        )
        stamp = record.spec.acquire_time if record.spec else None
        client.CoreV1Api(api).create_namespaced_event(
            leadership.namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{leadership.name}.", namespace=leadership.namespace),
                involved_object=client.V1ObjectReference(
                    api_version="coordination.k8s.io/v1",
                    kind="Lease",
                    name=leadership.name,
                    namespace=leadership.namespace,
                    uid=record.metadata.uid if record.metadata else None,
                ),
                reason="LeaderElection",
                message=f"{leadership.identity} became leader",
                type="Normal",
                source=client.V1EventSource(component="gym-checkpoint-operator"),
                first_timestamp=stamp,
                last_timestamp=stamp,
                count=1,
            ),
            _request_timeout=10,
        )
    except Exception as exc:
        log.warning(f"could not post the LeaderElection Event ({exc})")


def _deployment_uid(api: client.ApiClient, namespace: str, stop: threading.Event) -> str | None:
    """The uid of this operator's Deployment (GYMCKPT_OPERATOR_DEPLOYMENT): an uninstall mark names it. None without
    one (run by hand); retried while the API does not answer, as the leadership is."""
    name = os.environ.get("GYMCKPT_OPERATOR_DEPLOYMENT")
    if not name:
        return None
    while True:
        try:
            found = client.AppsV1Api(api).read_namespaced_deployment(name, namespace, _request_timeout=10)
            return str(found.metadata.uid) if found.metadata and found.metadata.uid else None
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            log.warning(f"reading Deployment {name} failed ({exc.status} {exc.reason}); retrying")
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning(f"reading Deployment {name} failed ({exc}); retrying")
        if stop.wait(2.0):
            return None


async def _until_stopped() -> None:
    """Wait for SIGTERM or SIGINT (kopf's own handlers are replaced)."""
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled.set)
    await signalled.wait()


async def _serve_gateway(url: str, api: client.ApiClient, namespace: str, settings: OperatorSettings) -> Any:
    host, port, _ = probes.endpoint(url)
    assert settings.gateway_key is not None
    default = StorageConfig(endpoint_url=settings.endpoint_url, region=settings.region)
    signer = GrantSigner(settings.gateway_key.get_secret_value().encode())
    return await gateway.serve(gateway.Gateway(signer, Kube(api), namespace, default), host, port)


async def run(
    namespace: str,
    leadership: LeadershipSettings,
    liveness: str | None,
    storage_gateway: str | None = None,
    settings: OperatorSettings | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:  # while standing by; kopf installs its own once it runs
        loop.add_signal_handler(sig, stop.set)
    api = api_client()
    instance = await asyncio.to_thread(_deployment_uid, api, namespace, stop)
    candidate = Leadership(leadership, client.CoordinationV1Api(api), instance=instance)
    candidate.on_lost = _lost  # a fence that finds the leadership gone ends the process before anything is sent
    operating = asyncio.Event()  # kopf's startup handlers ran: it is watching
    step_down = asyncio.Event()  # the release is being uninstalled: kopf stops, the finalizers go
    # kopf's stop flag: set by the step-down, and by the cleanup handler however kopf stops. kopf waits for the
    # flag in a task of its own, which a SIGTERM leaves pending; kopf then waited 5 s for it as a hung task before
    # it returned, and only then was the Lease released (a standby took over 5 s later at every rolling update)
    kopf_stop = asyncio.Event()
    probe = probes.Probes(candidate, operating, settings.release if settings else "")
    kube = Kube(api)

    def stepping_down(mark: str) -> None:
        log.warning(
            f"the release is being uninstalled (Lease {leadership.namespace}/{leadership.name} marked for operator "
            f"Deployment {mark}): stepping down, letting go of the release's finalizers"
        )
        loop.call_soon_threadsafe(step_down.set)
        loop.call_soon_threadsafe(kopf_stop.set)

    health = await probe.serve(liveness) if liveness else None
    signing = await _serve_gateway(storage_gateway, api, namespace, settings) if storage_gateway and settings else None
    recheck: asyncio.Task[None] | None = None
    try:
        if not await probe.until_crds_fit(kube, stop):  # a replica over older CRDs never leads (probes.py)
            return 0
        recheck = asyncio.create_task(probe.recheck_crds(kube), name="CRD recheck")
        if not await asyncio.to_thread(candidate.acquire, stop):
            return 0
        for sig in signals:
            loop.remove_signal_handler(sig)
        threading.Thread(
            target=candidate.keep, args=(stop, _lost, stepping_down), name="leadership renewal", daemon=True
        ).start()
        await asyncio.to_thread(_post_leader_event, api, leadership)
        await kopf.operator(
            ready_flag=operating,
            stop_flag=kopf_stop,
            standalone=True,
            namespaces=[namespace],
            memo=kopf.Memo(
                identity=leadership.identity, leadership=candidate, namespace=namespace, kopf_stop=kopf_stop
            ),
        )
        if step_down.is_set():
            probe.stepped_down = True
            stop.set()
            await asyncio.to_thread(candidate.release)
            log.info("stepped down for the uninstall; standing by until stopped")
            await _until_stopped()
        return 0
    finally:
        stop.set()
        if recheck is not None:
            recheck.cancel()
        await asyncio.to_thread(candidate.release)
        if health is not None:
            await health.cleanup()
        if signing is not None:
            await signing.cleanup()


if __name__ == "__main__":
    sys.exit(main())
