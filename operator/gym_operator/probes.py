"""The operator's probes, answered by every replica from its first second: liveness (``--liveness URL``: the process
runs; the kubelet restarts a hung one, never a healthy standby) and readiness (``/readyz`` on the same port: the
replica can do its part).

Ready means: the installed CRDs have every spec field this operator reads (every replica checks them,
:mod:`gym_operator.crdcheck`, before it competes for the leadership, and again every :data:`CRD_RECHECK_S`), and
either it leads and kopf runs, or it stands by and reads the Kubernetes Lease (it could take over). A replica over
older CRDs is unready and never leads: a rollout of a new operator version over CRDs nobody upgraded stops at its first
new pod (``helm upgrade --wait`` fails, saying why in the probe's answer and the pod's log), while the old pods keep
working; nothing crash-loops.

Both answer ``{"ready", "reason", "leader", "operating", "identity", "holder"}`` (liveness always 200, readiness 200 or
503). The same port serves ``GET /metrics`` (:mod:`gym_operator.metrics`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.parse

import aiohttp.web

from gym_operator import crdcheck
from gym_operator.kube import Kube, Unavailable
from gym_operator.leadership import Leadership
from gym_operator.metrics import CONTENT_TYPE, METRICS

log = logging.getLogger("gym.operator")

#: seconds between CRD checks: while they are wrong (before leading), and once they were right (readiness only)
CRD_RETRY_S = 15.0
CRD_RECHECK_S = 300.0
READINESS_PATH = "/readyz"


def endpoint(url: str) -> tuple[str, int, str]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise ValueError(f"{url!r}: expected http://HOST:PORT[/PATH]")
    return parsed.hostname, parsed.port, parsed.path or "/"


class Probes:
    """What one replica's probes answer, and the CRD check they depend on."""

    def __init__(self, candidate: Leadership, operating: asyncio.Event, release: str = "") -> None:
        self.candidate, self.operating, self.release = candidate, operating, release
        self.crds: str | None = "the installed CRDs are not checked yet"
        self.stepped_down = False  # the release is being uninstalled: standing by for good

    def problem(self) -> str | None:
        """Why this replica is not ready (None: it is)."""
        if self.crds is not None:
            return self.crds
        if self.stepped_down:
            return None
        if self.candidate.leader:
            return None if self.operating.is_set() else "leading; the handlers are starting"
        if self.candidate.uninstalling or self.candidate.watching():
            return None
        return "standing by, but the Kubernetes Lease could not be read lately: it could not take over"

    def answer(self) -> dict[str, object]:
        reason = self.problem()
        return {
            "ready": reason is None,
            "reason": reason,
            "leader": self.candidate.leader,
            "operating": self.operating.is_set(),
            "identity": self.candidate.settings.identity,
            "holder": self.candidate.holder,
        }

    async def serve(self, url: str) -> aiohttp.web.AppRunner:
        host, port, path = endpoint(url)

        async def liveness(_: aiohttp.web.Request) -> aiohttp.web.Response:
            return aiohttp.web.Response(text=json.dumps(self.answer()), content_type="application/json")

        async def readiness(_: aiohttp.web.Request) -> aiohttp.web.Response:
            body = self.answer()
            status = 200 if body["ready"] else 503
            return aiohttp.web.Response(text=json.dumps(body), status=status, content_type="application/json")

        async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
            METRICS.lead(self.release, self.candidate.leader)
            return aiohttp.web.Response(body=METRICS.exposition(), headers={"Content-Type": CONTENT_TYPE})

        app = aiohttp.web.Application()
        app.router.add_get(path, liveness)
        app.router.add_get(READINESS_PATH, readiness)
        app.router.add_get("/metrics", metrics)
        runner = aiohttp.web.AppRunner(app, access_log=None)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, host, port).start()
        return runner

    async def check_crds(self, kube: Kube) -> None:
        """One CRD check; its outcome is what readiness says."""
        try:
            self.crds = await crdcheck.problem(kube)
        except Unavailable as exc:
            self.crds = f"the installed CRDs could not be checked: the Kubernetes API did not answer ({exc})"

    async def until_crds_fit(self, kube: Kube, stop: threading.Event) -> bool:
        """Check the CRDs until they fit this operator (True) or ``stop`` (False); say once per distinct problem."""
        said = None
        while not stop.is_set():
            await self.check_crds(kube)
            if self.crds is None:
                if said is not None:
                    log.info("the installed CRDs fit this operator now: competing for the leadership")
                return True
            if self.crds != said:
                log.error(f"not ready, not competing for the leadership: {self.crds}")
                said = self.crds
            await asyncio.to_thread(stop.wait, CRD_RETRY_S)
        return False

    async def recheck_crds(self, kube: Kube) -> None:
        """Now and then, for readiness (a leader keeps running; someone applied older CRDs: it turns unready)."""
        while True:
            await asyncio.sleep(CRD_RECHECK_S)
            before = self.crds
            await self.check_crds(kube)
            if self.crds is not None and self.crds != before:
                log.error(f"not ready: {self.crds}")
