"""The operator's process (``gym-operator``): leader election first, then kopf with the handlers.

``gym-operator --namespace NS [--liveness URL] [--storage-gateway URL] [--log-format json|plain|full]
[--verbose|--quiet]``

Every replica of a release's operator runs this. Each is a candidate for the release's leadership, its Kubernetes
Lease (:mod:`gym_operator.leadership`); only the holder starts kopf (:mod:`gym_operator.handlers`), so only one operator
ever coordinates a transaction. The others stand by. Every replica answers ``--liveness`` (``GET`` on its path:
200 and ``{"leader", "operating", "identity", "holder"}``, ``operating`` once kopf's startup ran) from its first
second, standing by or not, so the kubelet restarts a hung process, never a healthy standby; the same port serves
``GET /metrics`` (:mod:`gym_operator.metrics`). Every replica also serves the storage gateway at
``--storage-gateway`` (:mod:`gym_operator.gateway`; it needs ``GYMCKPT_GATEWAY_KEY``).

Exit status: 0 stopped (SIGTERM/SIGINT; a leader releases its Lease first), 2 bad settings, 3 the Lease was
lost (:data:`gym_operator.leadership.EXIT_LOST`: stop acting at once, as client-go's leader election does; the
kubelet restarts the container, which then stands by).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import urllib.parse
from typing import Any

import aiohttp.web
import kopf
from kubernetes import client

import gym_operator.handlers  # noqa: F401  (registers the handlers with kopf; imported before the loop runs)
from gym_operator import gateway
from gym_operator.kube import Kube, api_client
from gym_operator.leadership import EXIT_LOST, Leadership, LeadershipSettings
from gym_operator.metrics import CONTENT_TYPE, METRICS
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kopf.configure(verbose=args.verbose, quiet=args.quiet, log_format=kopf.LogFormat[args.log_format.upper()])
    try:
        settings = OperatorSettings.from_env()  # refused here, before standing by for a leadership it could not use
        leadership = LeadershipSettings.from_env(args.namespace)
        if args.liveness:
            _endpoint(args.liveness)
        if args.storage_gateway:
            _endpoint(args.storage_gateway)
            if settings.gateway_key is None:
                raise ValueError("--storage-gateway needs GYMCKPT_GATEWAY_KEY (the key its grants are signed with)")
    except (SpecError, ValueError) as exc:
        print(f"gym-operator: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(args.namespace, leadership, args.liveness, args.storage_gateway, settings))


def _endpoint(url: str) -> tuple[str, int, str]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise ValueError(f"{url!r}: expected http://HOST:PORT[/PATH]")
    return parsed.hostname, parsed.port, parsed.path or "/"


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


async def _serve_liveness(
    url: str, candidate: Leadership, operating: asyncio.Event, release: str
) -> aiohttp.web.AppRunner:
    host, port, path = _endpoint(url)

    async def health(_: aiohttp.web.Request) -> aiohttp.web.Response:
        body = {
            "leader": candidate.leader,
            "operating": operating.is_set(),
            "identity": candidate.settings.identity,
            "holder": candidate.holder,
        }
        return aiohttp.web.Response(text=json.dumps(body), content_type="application/json")

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        METRICS.lead(release, candidate.leader)
        return aiohttp.web.Response(body=METRICS.exposition(), headers={"Content-Type": CONTENT_TYPE})

    app = aiohttp.web.Application()
    app.router.add_get(path, health)
    app.router.add_get("/metrics", metrics)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner


async def _serve_gateway(url: str, api: client.ApiClient, namespace: str, settings: OperatorSettings) -> Any:
    host, port, _ = _endpoint(url)
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
    candidate = Leadership(leadership, client.CoordinationV1Api(api))
    operating = asyncio.Event()  # kopf's startup handlers ran: it is watching
    release = settings.release if settings else ""
    health = await _serve_liveness(liveness, candidate, operating, release) if liveness else None
    signing = await _serve_gateway(storage_gateway, api, namespace, settings) if storage_gateway and settings else None
    try:
        if not await asyncio.to_thread(candidate.acquire, stop):
            return 0
        for sig in signals:
            loop.remove_signal_handler(sig)
        threading.Thread(target=candidate.keep, args=(stop, _lost), name="leadership renewal", daemon=True).start()
        await asyncio.to_thread(_post_leader_event, api, leadership)
        memo = kopf.Memo(identity=leadership.identity, namespace=namespace)
        await kopf.operator(ready_flag=operating, standalone=True, namespaces=[namespace], memo=memo)
        return 0
    finally:
        stop.set()
        await asyncio.to_thread(candidate.release)
        if health is not None:
            await health.cleanup()
        if signing is not None:
            await signing.cleanup()


if __name__ == "__main__":
    sys.exit(main())
