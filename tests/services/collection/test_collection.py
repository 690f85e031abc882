"""Rollout collection as a controller participant, against a real (small) agent app in process."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.base.config import load_config
from gym_services.collection.app import Config, create_app
from tests.support.asgi import MultiASGITransport, base_config, serve, Control


class FakeAgent:
    """Answers /run with the task's value as reward once ``gate`` opens; logs every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.active = 0
        self.max_active = 0
        self.stale: set[tuple[str, int]] = set()
        self.allowed: set[str] = set()

    def release(self, *rollout_ids: str) -> None:
        self.allowed.update(rollout_ids)

    def app(self) -> Starlette:
        async def run(request: Request) -> JSONResponse:
            body = await request.json()
            key = (body["_ng_rollout_id"], body["_ng_attempt_index"])
            self.calls.append(key)
            if key in self.stale:
                return JSONResponse({"error": {"code": "stale_attempt", "message": "old"}}, status_code=409)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                for _ in range(1000):
                    if self.gate.is_set() or key[0] in self.allowed:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("never released")
            finally:
                self.active -= 1
            return JSONResponse({"reward": body["value"], "task": body["_ng_task_index"]})

        return Starlette(routes=[Route("/run", run, methods=["POST"])])


def write_tasks(tmp_path, n=5):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"value": i / 10, "agent": "fake"}) + "\n" for i in range(n)))
    return str(path)


def collection_app(agent: FakeAgent):
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"}))
    return create_app(cfg, transport=MultiASGITransport({"fake": agent.app()}))


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def settled_status(client, timeout=5.0) -> dict:
    """The job status once no episode is live; the last result line lands before the state flips."""
    for _ in range(int(timeout / 0.01)):
        status = (await client.get("/jobs/current")).json()
        if status["state"] != "running" and status["live"] == 0:
            return status
        await asyncio.sleep(0.01)
    raise AssertionError(f"job never settled: {status}")


async def test_collects_every_task_with_bounded_concurrency(tmp_path) -> None:
    agent = FakeAgent()
    agent.gate.set()
    tasks = write_tasks(tmp_path, 6)
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent)) as client:
        started = await client.post("/jobs", json={"tasks_path": tasks, "output_path": str(out), "repeats": 2, "concurrency": 3})
        assert started.status_code == 200 and started.json()["total"] == 12
        await wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 12)
        status = await settled_status(client)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["_ng_rollout_id"] for r in rows) == sorted(f"{t}-{r}" for t in range(6) for r in range(2))
    assert all(r["_ng_attempt_index"] == 0 and r["reward"] == r["_ng_task_index"] / 10 for r in rows)
    assert agent.max_active <= 3
    assert status["state"] == "completed" and status["mean_reward"] == pytest.approx(0.25)


async def test_bad_job_specs_are_refused(tmp_path) -> None:
    agent = FakeAgent()
    async with serve(collection_app(agent)) as client:
        missing = await client.post("/jobs", json={"tasks_path": str(tmp_path / "nope"), "output_path": str(tmp_path / "o")})
        assert missing.status_code == 400 and "cannot read tasks" in missing.json()["error"]["message"]
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"agent": "unknown"}\n')
        unknown = await client.post("/jobs", json={"tasks_path": str(bad), "output_path": str(tmp_path / "o")})
        assert unknown.status_code == 400 and "unknown" in unknown.json()["error"]["message"]
        assert (await client.post("/jobs", json={"repeats": 0})).status_code == 400


async def test_checkpoint_restore_reissues_live_as_next_attempt(tmp_path) -> None:
    loc = f"file://{tmp_path / 'ckpt'}"
    tasks = write_tasks(tmp_path, 5)
    out = tmp_path / "out.jsonl"
    agent = FakeAgent()
    async with serve(collection_app(agent)) as client:
        control = Control(client)
        await client.post("/jobs", json={"tasks_path": tasks, "output_path": str(out), "concurrency": 2})
        await wait_for(lambda: len(agent.calls) == 2)
        # let exactly the first two finish, then two more start
        agent.release("0-0", "1-0")
        await wait_for(lambda: len(out.read_text().splitlines()) == 2)
        await wait_for(lambda: agent.active == 2 and len(agent.calls) == 4)
        prepared = await control.prepare("ck1")
        assert prepared["status"] == "prepared"
        calls_at_prepare = len(agent.calls)
        committed = await control.commit("ck1", loc)
        assert committed["records"] == 3  # the job + two live episodes
        assert committed["episodes"] == ["2-0", "3-0"]
        await asyncio.sleep(0.1)
        assert len(agent.calls) == calls_at_prepare  # prepare stopped new dispatch
        await control.resume("ck1")
        agent.gate.set()  # the old process runs ahead of the checkpoint, then dies
        await wait_for(lambda: len(out.read_text().splitlines()) == 5)

    fresh_agent = FakeAgent()
    fresh_agent.gate.set()
    async with serve(collection_app(fresh_agent)) as client:
        control = Control(client)
        restored = await control.restore("ck1", loc, committed["manifest_key"])
        assert restored["episodes"] == {"2-0": 1, "3-0": 1}
        assert len(out.read_text().splitlines()) == 2  # results after the checkpoint are dropped
        await control.resume("ck1")
        await wait_for(lambda: len(out.read_text().splitlines()) == 5)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["_ng_rollout_id"] for r in rows]
    assert sorted(ids) == ["0-0", "1-0", "2-0", "3-0", "4-0"] and len(set(ids)) == 5
    assert sorted(fresh_agent.calls) == [("2-0", 1), ("3-0", 1), ("4-0", 0)]  # finished ones never again
    assert {r["_ng_rollout_id"]: r["_ng_attempt_index"] for r in rows}["2-0"] == 1


async def test_stale_attempt_answer_is_not_a_result(tmp_path) -> None:
    agent = FakeAgent()
    agent.gate.set()
    agent.stale.add(("0-0", 0))
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 2), "output_path": str(out)})
        await wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 1)
        status = await settled_status(client)
    assert [json.loads(line)["_ng_rollout_id"] for line in out.read_text().splitlines()] == ["1-0"]
    assert status["live"] == 0 and status["errors"] == 0


async def test_retire_drops_a_live_episode(tmp_path) -> None:
    agent = FakeAgent()
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 1), "output_path": str(out)})
        await wait_for(lambda: agent.active == 1)
        answer = await Control(client).retire("0-0", 0)
        assert answer["retired"] is True
        status = await settled_status(client)
    assert status["state"] == "completed" and status["live"] == 0 and out.read_text() == ""
