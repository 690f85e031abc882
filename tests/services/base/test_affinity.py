"""Rollout affinity: the replica of a rollout is stable (a restored stack, a newer version, another caller
all pick the same), spread evenly, and replicated servers are written as URL lists or ranges."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from gym_services.agents.common.downstream import Downstream
from gym_services.base.affinity import expand_endpoints, replica_for
from gym_services.base.identity import RolloutIdentity


def test_the_replica_of_a_rollout_never_changes() -> None:
    # pinned: a checkpoint taken by one version is restored by another, and every caller must agree
    assert [replica_for(rid, 4) for rid in ["0-0", "0-1", "1-0", "rollout-a", "r-17", "26-1"]] == [2, 1, 2, 3, 0, 2]
    assert [replica_for("0-0", n) for n in (1, 2, 3, 4, 8)] == [0, 0, 2, 2, 6]
    with pytest.raises(ValueError):
        replica_for("0-0", 0)


@pytest.mark.parametrize("replicas", [2, 4, 8])
def test_rollouts_spread_evenly(replicas: int) -> None:
    counts = Counter(replica_for(f"{task}-{repeat}", replicas) for task in range(2000) for repeat in range(4))
    share = 8000 / replicas
    assert sorted(counts) == list(range(replicas))
    assert all(abs(n - share) < 0.1 * share for n in counts.values()), counts


def test_endpoints_lists_and_ranges() -> None:
    assert expand_endpoints("http://127.0.0.1:8000/") == ["http://127.0.0.1:8000"]
    assert expand_endpoints("http://gym-a-{0..2}.gym-a-headless.ns.svc:8000/v1") == [
        "http://gym-a-0.gym-a-headless.ns.svc:8000/v1",
        "http://gym-a-1.gym-a-headless.ns.svc:8000/v1",
        "http://gym-a-2.gym-a-headless.ns.svc:8000/v1",
    ]
    assert expand_endpoints(["http://127.0.0.1:1", "http://127.0.0.1:{2..3}"]) == [
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        "http://127.0.0.1:3",
    ]
    for bad in (
        [],
        "http://x-{0..1}-{0..1}",
        "http://x-{2..1}",
        "http://x-{0..5000}",
        "x:1",
        ["http://a", "http://a/"],
    ):
        with pytest.raises(ValueError):
            expand_endpoints(bad)


async def test_every_call_of_a_rollout_reaches_its_replica() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.headers.get('x-ng-rollout-id')}")
        return httpx.Response(200, json={})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        downstream = Downstream("resources", ["http://r0", "http://r1", "http://r2"], client)
        for rid in ["0-0", "0-1", "rollout-a", "0-0"]:
            for attempt in (0, 1):
                await downstream.post(
                    "/step", {}, identity=RolloutIdentity(rollout_id=rid, attempt=attempt), cookies={}
                )
        await downstream.post("/step", {}, identity=None, cookies={})
    expected = [f"r{replica_for(rid, 3)}:{rid}" for rid in ["0-0", "0-1", "rollout-a", "0-0"] for _ in (0, 1)]
    assert seen == [*expected, "r0:None"]
