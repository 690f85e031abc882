"""Rollout collection as a controller participant, against a real (small) agent app in process."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import JOB_AUTH, Control, MultiASGITransport, base_config
from tests.support.asgi import serve as serve_app

from gym_services.base.config import load_config
from gym_services.collection.app import Config, create_app

#: jobs of these tests read and write under the temporary folder (tmp_path); confinement is tested on its own
TMP = str(Path(tempfile.gettempdir()).resolve())


def serve(app, **kw):
    """The app with a client that carries the job token."""
    return serve_app(app, headers=JOB_AUTH, **kw)


class FakeAgent:
    """Answers /run with the task's value as reward once ``gate`` opens; logs every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.active = 0
        self.max_active = 0
        self.stale: set[tuple[str, int]] = set()
        self.allowed: set[str] = set()
        #: (rollout id, attempt) -> (status, error code) answered instead of a result
        self.refuse: dict[tuple[str, int], tuple[int, str]] = {}

    def release(self, *rollout_ids: str) -> None:
        self.allowed.update(rollout_ids)

    def app(self) -> Starlette:
        async def run(request: Request) -> JSONResponse:
            body = await request.json()
            key = (body["_ng_rollout_id"], body["_ng_attempt_index"])
            self.calls.append(key)
            if key in self.stale:
                return JSONResponse({"error": {"code": "stale_attempt", "message": "old"}}, status_code=409)
            if key in self.refuse or (key[0], -1) in self.refuse:
                status, code = self.refuse.get(key) or self.refuse[(key[0], -1)]
                return JSONResponse({"error": {"code": code, "message": f"refused {key}"}}, status_code=status)
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


def collection_app(agent: FakeAgent, transport: httpx.AsyncBaseTransport | None = None, **config):
    retry = {"unavailable_backoff_s": 0.01, "unavailable_backoff_max_s": 0.05, "job_dirs": [TMP], **config}
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"}, **retry))
    return create_app(cfg, transport=transport or MultiASGITransport({"fake": agent.app()}))


class Unreachable(httpx.AsyncBaseTransport):
    """The agent cannot be connected to for its first ``failures`` calls (a restarting pod)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, failures: int) -> None:
        self.inner, self.failures, self.refused = inner, failures, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refused < self.failures:
            self.refused += 1
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


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
        started = await client.post(
            "/jobs", json={"tasks_path": tasks, "output_path": str(out), "repeats": 2, "concurrency": 3}
        )
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
        missing = await client.post(
            "/jobs", json={"tasks_path": str(tmp_path / "nope"), "output_path": str(tmp_path / "o")}
        )
        assert missing.status_code == 400 and "cannot read tasks" in missing.json()["error"]["message"]
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"agent": "unknown"}\n')
        unknown = await client.post("/jobs", json={"tasks_path": str(bad), "output_path": str(tmp_path / "o")})
        assert unknown.status_code == 400 and "1 task (task 1) names no agent" in unknown.json()["error"]["message"]
        assert "unknown" not in unknown.json()["error"]["message"]  # the file's content is not echoed
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
        committed = await control.capture_persist("ck1", loc)
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


async def _checkpoint_two_finished(tmp_path, loc: str):
    """A job of 4 tasks with 0-0 and 1-0 finished and 2-0, 3-0 live at checkpoint ck1; returns the commit answer."""
    tasks = write_tasks(tmp_path, 4)
    out = tmp_path / "out.jsonl"
    agent = FakeAgent()
    async with serve(collection_app(agent)) as client:
        control = Control(client)
        await client.post("/jobs", json={"tasks_path": tasks, "output_path": str(out), "concurrency": 2})
        await wait_for(lambda: len(agent.calls) == 2)
        agent.release("0-0", "1-0")
        await wait_for(lambda: len(out.read_text().splitlines()) == 2)
        await wait_for(lambda: agent.active == 2 and len(agent.calls) == 4)
        committed = await control.checkpoint("ck1", loc)
        agent.gate.set()
        await wait_for(lambda: len(out.read_text().splitlines()) == 4)
    return committed, out


@pytest.mark.parametrize("other", ["another job's results", "same length, other bytes", "torn line"])
async def test_restore_refuses_a_results_file_it_never_saw_and_changes_nothing(tmp_path, other) -> None:
    """The results file now holds other content (another job wrote the same path): the restore
    must not cut it at the checkpoint's offset; it is refused with the file untouched."""
    loc = f"file://{tmp_path / 'ckpt'}"
    committed, out = await _checkpoint_two_finished(tmp_path, loc)
    rows = out.read_bytes().splitlines(keepends=True)
    checkpointed = b"".join(r for r in rows if json.loads(r)["_ng_rollout_id"] in ("0-0", "1-0"))
    if other == "another job's results":
        content = b"".join(r.replace(b'"reward": 0', b'"reward": 9') for r in rows) * 3
    elif other == "same length, other bytes":
        content = checkpointed.replace(b'"0-0"', b'"0-9"') + b"tail\n"
    else:
        content = checkpointed[:-7]  # the file ends inside the checkpoint's last line
        content += b"x" * 20
    out.write_bytes(content)
    fresh_agent = FakeAgent()
    fresh_agent.gate.set()
    async with serve(collection_app(fresh_agent)) as client:
        control = Control(client)
        refused = await control.restore("ck1", loc, committed["manifest_key"], expect=422)
        assert refused["error"]["code"] == "invalid_state"
        assert "restore refused, nothing changed: the results file" in refused["error"]["message"]
        status = await control.status()
        assert status["phase"] == "fresh" and status["admission_open"]
        assert (await client.get("/jobs/current")).json()["state"] == "idle"
    assert out.read_bytes() == content and fresh_agent.calls == []


async def test_restore_truncates_only_what_came_after_the_checkpoint(tmp_path) -> None:
    loc = f"file://{tmp_path / 'ckpt'}"
    committed, out = await _checkpoint_two_finished(tmp_path, loc)
    before = out.read_bytes()
    fresh_agent = FakeAgent()
    fresh_agent.gate.set()
    async with serve(collection_app(fresh_agent)) as client:
        control = Control(client)
        await control.restore("ck1", loc, committed["manifest_key"])
        kept = out.read_bytes()
        assert before.startswith(kept) and len(kept.splitlines()) == 2
        await control.resume("ck1")
        await wait_for(lambda: len(out.read_text().splitlines()) == 4)
        # the digest carries on from the restored prefix: a second checkpoint and restore still match
        await settled_status(client)
        again = await control.checkpoint("ck2", loc)
    async with serve(collection_app(FakeAgent())) as client:
        restored = await Control(client).restore("ck2", loc, again["manifest_key"])
        assert restored["episodes"] == {}
    assert len(out.read_text().splitlines()) == 4


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


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


async def test_agent_answering_503_is_run_again_as_the_next_attempt(tmp_path) -> None:
    """A server behind the agent was down past the agent's deadline: not a result, the episode runs again."""
    agent = FakeAgent()
    agent.gate.set()
    agent.refuse[("1-0", 0)] = (503, "upstream_unavailable")
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 3), "output_path": str(out)})
        status = await settled_status(client)
    rows = {r["_ng_rollout_id"]: r for r in _rows(out)}
    assert sorted(rows) == ["0-0", "1-0", "2-0"] and not any("error" in r for r in rows.values())
    assert rows["1-0"]["_ng_attempt_index"] == 1 and rows["1-0"]["reward"] == 0.1
    assert ("1-0", 0) in agent.calls and ("1-0", 1) in agent.calls
    assert status["errors"] == 0 and status["reruns"] == 1


async def test_unreachable_agent_gets_the_same_attempt_again(tmp_path) -> None:
    agent = FakeAgent()
    agent.gate.set()
    transport = Unreachable(MultiASGITransport({"fake": agent.app()}), failures=4)
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent, transport)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 2), "output_path": str(out)})
        status = await settled_status(client)
    rows = _rows(out)
    assert transport.refused == 4 and len(rows) == 2
    assert all(r["_ng_attempt_index"] == 0 and "error" not in r for r in rows)
    assert status["errors"] == 0 and status["reruns"] == 0


async def test_infrastructure_failures_past_the_deadline_are_an_error_row(tmp_path) -> None:
    agent = FakeAgent()
    agent.gate.set()
    agent.refuse[("0-0", -1)] = (503, "upstream_unavailable")  # every attempt
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent, unavailable_deadline_s=0.3)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 2), "output_path": str(out)})
        status = await settled_status(client)
    rows = {r["_ng_rollout_id"]: r for r in _rows(out)}
    assert "error" not in rows["1-0"]
    error = rows["0-0"]["error"]
    assert error.startswith("gave up after") and "upstream_unavailable" in error, error
    assert rows["0-0"]["_ng_attempt_index"] >= 1 and status["errors"] == 1 and status["reruns"] >= 1


async def test_an_episodes_own_failure_is_a_result_not_a_rerun(tmp_path) -> None:
    agent = FakeAgent()
    agent.gate.set()
    agent.refuse[("0-0", 0)] = (502, "upstream_error")  # e.g. a tool answered 500: the episode's outcome
    out = tmp_path / "out.jsonl"
    async with serve(collection_app(agent)) as client:
        await client.post("/jobs", json={"tasks_path": write_tasks(tmp_path, 1), "output_path": str(out)})
        status = await settled_status(client)
    (row,) = _rows(out)
    assert row["error"] == "HTTP 502: upstream_error: refused ('0-0', 0)" and row["_ng_attempt_index"] == 0
    assert agent.calls == [("0-0", 0)] and status["reruns"] == 0
