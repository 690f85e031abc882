"""The operator's process (``gym-operator``): leader election first, then kopf with the handlers.

``gym-operator --namespace NS [--liveness URL] [--log-format json|plain|full] [--verbose|--quiet]``

Every replica of a release's operator runs this. Each is a candidate for the release's Lease
(:mod:`gym_operator.leader`); only the holder starts kopf (:mod:`gym_operator.handlers`), so only one operator
ever coordinates a transaction. The others stand by. Every replica answers ``--liveness`` (``GET`` on its path:
200 and ``{"leader", "operating", "identity", "holder"}``, ``operating`` once kopf's startup ran) from its first
second, standing by or not, so the kubelet restarts a hung process, never a healthy standby.

Exit status: 0 stopped (SIGTERM/SIGINT; a leader releases its Lease first), 2 bad settings, 3 the Lease was
lost (:data:`gym_operator.leader.EXIT_LOST`: stop acting at once, as client-go's leader election does; the
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

import aiohttp.web
import kopf
from kubernetes import client

import gym_operator.handlers  # noqa: F401  (registers the handlers with kopf; imported before the loop runs)
from gym_operator.kube import api_client
from gym_operator.leader import EXIT_LOST, ElectionSettings, Elector
from gym_operator.specs import OperatorSettings, SpecError

log = logging.getLogger("gym.operator")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gym-operator", description="Run the Gym Checkpoint operator of one release (leader-elected)"
    )
    p.add_argument("--namespace", required=True, help="the release's namespace (its resources, pods and Lease)")
    p.add_argument("--liveness", metavar="URL", help="serve the liveness probe here, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--log-format", choices=["json", "plain", "full"], default="full", help="kopf's log format")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--verbose", action="store_true", help="debug logs")
    level.add_argument("--quiet", action="store_true", help="warnings and errors only")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kopf.configure(verbose=args.verbose, quiet=args.quiet, log_format=kopf.LogFormat[args.log_format.upper()])
    try:
        OperatorSettings.from_env()  # refused here, before standing by for a Lease it could not use
        election = ElectionSettings.from_env(args.namespace)
        if args.liveness:
            _endpoint(args.liveness)
    except (SpecError, ValueError) as exc:
        print(f"gym-operator: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(args.namespace, election, args.liveness))


def _endpoint(url: str) -> tuple[str, int, str]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise ValueError(f"--liveness {url!r}: expected http://HOST:PORT/PATH")
    return parsed.hostname, parsed.port, parsed.path or "/"


def _lost(why: str) -> None:
    """The Lease is gone: stop acting now. No cleanup that could still talk to a server or the API."""
    log.critical(f"{why}; exiting so that only the new leader acts", extra={"leader": False})
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_LOST)


def _post_leader_event(api: client.ApiClient, election: ElectionSettings) -> None:
    """A Normal Event ``LeaderElection`` on the Lease, as client-go's recorder posts (best effort)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            election.lease_name, election.namespace, _request_timeout=10
        )
        stamp = lease.spec.acquire_time if lease.spec else None
        client.CoreV1Api(api).create_namespaced_event(
            election.namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{election.lease_name}.", namespace=election.namespace),
                involved_object=client.V1ObjectReference(
                    api_version="coordination.k8s.io/v1",
                    kind="Lease",
                    name=election.lease_name,
                    namespace=election.namespace,
                    uid=lease.metadata.uid if lease.metadata else None,
                ),
                reason="LeaderElection",
                message=f"{election.identity} became leader",
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


async def _serve_liveness(url: str, elector: Elector, operating: asyncio.Event) -> aiohttp.web.AppRunner:
    host, port, path = _endpoint(url)

    async def health(_: aiohttp.web.Request) -> aiohttp.web.Response:
        body = {
            "leader": elector.leader,
            "operating": operating.is_set(),
            "identity": elector.settings.identity,
            "holder": elector.holder,
        }
        return aiohttp.web.Response(text=json.dumps(body), content_type="application/json")

    app = aiohttp.web.Application()
    app.router.add_get(path, health)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner


async def run(namespace: str, election: ElectionSettings, liveness: str | None) -> int:
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:  # while standing by; kopf installs its own once it runs
        loop.add_signal_handler(sig, stop.set)
    api = api_client()
    elector = Elector(election, client.CoordinationV1Api(api))
    operating = asyncio.Event()  # kopf's startup handlers ran: it is watching
    health = await _serve_liveness(liveness, elector, operating) if liveness else None
    try:
        if not await asyncio.to_thread(elector.acquire, stop):
            return 0
        for sig in signals:
            loop.remove_signal_handler(sig)
        threading.Thread(target=elector.keep, args=(stop, _lost), name="lease renewal", daemon=True).start()
        await asyncio.to_thread(_post_leader_event, api, election)
        await kopf.operator(
            ready_flag=operating, standalone=True, namespaces=[namespace], memo=kopf.Memo(identity=election.identity)
        )
        return 0
    finally:
        stop.set()
        await asyncio.to_thread(elector.release)
        if health is not None:
            await health.cleanup()


if __name__ == "__main__":
    sys.exit(main())
