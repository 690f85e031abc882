"""A collection server hands out each rollout id once: a later job on the same server never reuses an earlier job's ids.

The agents, models and resources remember rollout ids: a finished result is kept a while (a repeated /run of the
same attempt gets it again, nothing re-runs) and the newest attempt fences older ones (409 stale_attempt). Before,
every job's ids were ``<task>-<repeat>``: a second job on the same stack got the first job's kept results for its
own tasks, and every rollout the first job had run again (attempt >= 1: a restore, an infrastructure failure) was
refused as stale at attempt 0 and dropped without a row - the job reported ``completed`` with rows missing (seen in
a chaos run that resubmitted its job to the same stack: 114 rows missing).
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.services.collection.test_collection import collection_app, serve, settled_status
from tests.support.asgi import MultiASGITransport


class RememberingAgent:
    """Remembers rollout ids as the real agents do (agents/common/participant.py ``run``): the same attempt of a
    finished rollout gets its kept result again, an older attempt than one seen is refused as stale; the first
    call of each rollout in ``unavailable`` answers 503 upstream_unavailable (the collection runs it again as
    attempt + 1)."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[int, dict]] = {}
        self.highest: dict[str, int] = {}
        self.unavailable: set[str] = set()
        self.ran: list[tuple[str, int]] = []

    def app(self) -> Starlette:
        async def run(request: Request) -> JSONResponse:
            body = await request.json()
            rid, attempt = body["_ng_rollout_id"], body["_ng_attempt_index"]
            if attempt < self.highest.get(rid, -1):
                return JSONResponse({"error": {"code": "stale_attempt", "message": f"{rid} attempt {attempt}"}}, 409)
            self.highest[rid] = max(attempt, self.highest.get(rid, -1))
            kept = self.kept.get(rid)
            if kept is not None and kept[0] == attempt:
                return JSONResponse(kept[1])
            if rid in self.unavailable:
                self.unavailable.discard(rid)
                return JSONResponse({"error": {"code": "upstream_unavailable", "message": "down"}}, 503)
            self.ran.append((rid, attempt))
            result = {"reward": body["value"], "task_value": body["value"]}
            self.kept[rid] = (attempt, result)
            return JSONResponse(result)

        return Starlette(routes=[Route("/run", run, methods=["POST"])])


def write_tasks(path, values) -> str:
    path.write_text("".join(json.dumps({"value": v, "agent": "fake"}) + "\n" for v in values))
    return str(path)


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_second_job_on_the_same_server_runs_every_task_of_its_own(tmp_path) -> None:
    agent = RememberingAgent()
    agent.unavailable = {"1-0", "3-0"}  # job 1 runs these again as attempt 1
    first_tasks = write_tasks(tmp_path / "first.jsonl", [0.1, 0.2, 0.3, 0.4])
    second_tasks = write_tasks(tmp_path / "second.jsonl", [0.5, 0.6, 0.7, 0.8])
    first, second = tmp_path / "first-out.jsonl", tmp_path / "second-out.jsonl"
    app = collection_app(agent, transport=MultiASGITransport({"fake": agent.app()}))
    async with serve(app) as client:
        answer = await client.post("/jobs", json={"tasks_path": first_tasks, "output_path": str(first)})
        assert answer.status_code == 200, answer.text
        status = await settled_status(client)
        assert status["finished"] == 4 and status["reruns"] == 2
        answer = await client.post("/jobs", json={"tasks_path": second_tasks, "output_path": str(second)})
        assert answer.status_code == 200, answer.text
        prefix = answer.json().get("rollout_prefix")
        status = await settled_status(client)
    got = rows(second)
    # every task of job 2 ran (none dropped as stale, none answered with job 1's kept result), each exactly once
    assert status["state"] == "completed" and sorted(r["_ng_task_index"] for r in got) == [0, 1, 2, 3], (status, got)
    assert {r["_ng_task_index"]: r["result"]["task_value"] for r in got} == {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.8}
    assert status["finished"] == 4 and status["dropped"] == 0, status
    assert prefix == "j2-"  # the server's second job; its first had none (ids <task>-<repeat>)
    assert {r["_ng_rollout_id"] for r in got} == {f"j2-{t}-0" for t in range(4)}
    assert {r["_ng_rollout_id"] for r in rows(first)} == {f"{t}-0" for t in range(4)}
    assert all(r["_ng_attempt_index"] == 0 and "error" not in r for r in got)


async def test_a_rollout_prefix_an_earlier_job_used_is_refused_and_changes_nothing(tmp_path) -> None:
    agent = RememberingAgent()
    tasks = write_tasks(tmp_path / "tasks.jsonl", [0.1, 0.2])
    first, second = tmp_path / "first-out.jsonl", tmp_path / "second-out.jsonl"
    app = collection_app(agent, transport=MultiASGITransport({"fake": agent.app()}))
    async with serve(app) as client:
        answer = await client.post(
            "/jobs", json={"rollout_prefix": "exp1-", "tasks_path": tasks, "output_path": str(first)}
        )
        assert answer.status_code == 200, answer.text
        before = await settled_status(client)
        content = first.read_bytes()
        refused = await client.post(
            "/jobs", json={"rollout_prefix": "exp1-", "tasks_path": tasks, "output_path": str(second)}
        )
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert "exp1-" in message and "earlier job" in message and "rollout_prefix" in message
        assert (await client.get("/jobs/current")).json() == before and first.read_bytes() == content
        assert not second.exists()
        again = await client.post(
            "/jobs", json={"rollout_prefix": "exp2-", "tasks_path": tasks, "output_path": str(second)}
        )
        assert again.status_code == 200 and again.json()["rollout_prefix"] == "exp2-"
        await settled_status(client)
    assert sorted(r["_ng_rollout_id"] for r in rows(second)) == ["exp2-0-0", "exp2-1-0"]


async def test_a_restore_onto_a_server_running_a_job_is_refused_and_changes_nothing(tmp_path) -> None:
    """Its dispatcher and live episodes would run on beside the restored job's: the same rollouts twice."""
    from tests.services.collection.test_collection import FakeAgent, _checkpoint_two_finished, wait_for
    from tests.support.asgi import Control

    loc = f"file://{tmp_path / 'ckpt'}"
    committed, _ = await _checkpoint_two_finished(tmp_path, loc)
    agent = FakeAgent()  # holds every episode until released
    out = tmp_path / "running.jsonl"
    async with serve(collection_app(agent)) as client:
        control = Control(client)
        answer = await client.post(
            "/jobs",
            json={
                "tasks_path": write_tasks(tmp_path / "other.jsonl", [0.5, 0.6, 0.7]),
                "output_path": str(out),
                "concurrency": 2,
            },
        )
        assert answer.status_code == 200, answer.text
        await wait_for(lambda: agent.active == 2)
        before = (await client.get("/jobs/current")).json()
        phase = (await control.status())["phase"]
        refused = await control.restore("ck1", loc, committed["manifest_key"], expect=422)
        assert refused["error"]["code"] == "invalid_state"
        assert "a collection job is running on this server" in refused["error"]["message"]
        after = (await client.get("/jobs/current")).json()
        assert {k: v for k, v in after.items() if k != "idle_s"} == {k: v for k, v in before.items() if k != "idle_s"}
        assert (await control.status())["phase"] == phase
        agent.gate.set()
        status = await settled_status(client)
    assert status["state"] == "completed" and status["finished"] == 3
    assert sorted(r["_ng_rollout_id"] for r in rows(out)) == ["0-0", "1-0", "2-0"]
