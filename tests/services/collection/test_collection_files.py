"""A collection server with a data_dir (its PersistentVolume on Kubernetes): tasks uploaded over HTTP, job
paths confined to the folder, results read back as checkpointed — the way `gymckpt collect --url` drives it."""

from __future__ import annotations

import asyncio
import json

from gym_services.base.config import load_config
from gym_services.collection.app import Config, create_app
from tests.services.collection.test_collection import FakeAgent, settled_status
from tests.support.asgi import MultiASGITransport, base_config, serve

TASKS = "".join(json.dumps({"value": i / 10, "agent": "fake"}) + "\n" for i in range(4)).encode()


def app_with_data_dir(agent: FakeAgent, data_dir, **extra):
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"},
                                                     data_dir=str(data_dir), **extra))
    return create_app(cfg, transport=MultiASGITransport({"fake": agent.app()}))


async def test_upload_run_and_read_results(tmp_path) -> None:
    agent = FakeAgent()
    data = tmp_path / "data"
    async with serve(app_with_data_dir(agent, data)) as client:
        assert (await client.get("/jobs/current/results")).status_code == 404  # no job yet
        uploaded = await client.put("/tasks/mine.jsonl", content=TASKS)
        assert uploaded.status_code == 200, uploaded.text
        assert uploaded.json() == {"tasks_path": "tasks/mine.jsonl", "tasks": 4, "bytes": len(TASKS)}
        assert (data / "tasks/mine.jsonl").read_bytes() == TASKS
        started = await client.post("/jobs", json={"tasks_path": "tasks/mine.jsonl", "output_path": "results/r1.jsonl",
                                                   "concurrency": 2})
        assert started.status_code == 200 and started.json()["output_path"] == str((data / "results/r1.jsonl").resolve())
        # while running, only finished results come back
        agent.release("0-0")
        for _ in range(500):  # the server counts a result once its line is written (the file has it a moment before)
            if (await client.get("/jobs/current")).json()["finished"] == 1:
                break
            await asyncio.sleep(0.01)
        partial = await client.get("/jobs/current/results")
        assert partial.status_code == 200 and partial.headers["x-gymckpt-job-state"] == "running"
        assert [json.loads(line)["_ng_rollout_id"] for line in partial.text.splitlines()] == ["0-0"]
        agent.gate.set()
        await settled_status(client)
        done = await client.get("/jobs/current/results")
    assert done.headers["x-gymckpt-job-state"] == "completed" and done.headers["x-gymckpt-results"] == "4"
    assert done.content == (data / "results/r1.jsonl").read_bytes()
    assert sorted(json.loads(line)["_ng_rollout_id"] for line in done.text.splitlines()) == ["0-0", "1-0", "2-0", "3-0"]


async def test_paths_and_uploads_are_confined_and_checked(tmp_path) -> None:
    agent = FakeAgent()
    data = tmp_path / "data"
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(TASKS)
    async with serve(app_with_data_dir(agent, data, max_upload_mb=1)) as client:
        for spec in ({"tasks_path": str(outside), "output_path": "results/x.jsonl"},
                     {"tasks_path": "../outside.jsonl", "output_path": "results/x.jsonl"},
                     {"tasks_path": "tasks/a.jsonl", "output_path": "/tmp/elsewhere.jsonl"}):
            refused = await client.post("/jobs", json=spec)
            assert refused.status_code == 400 and "outside this server's data_dir" in refused.json()["error"]["message"]
        for name in ("../x.jsonl", "x.txt", ".hidden.jsonl", "a b.jsonl"):
            bad_name = await client.put(f"/tasks/{name}", content=TASKS)
            assert bad_name.status_code in (400, 404), (name, bad_name.text)
        not_json = await client.put("/tasks/bad.jsonl", content=b'{"value": 1}\nnot json\n')
        assert not_json.status_code == 400 and "line 2 is not JSON" in not_json.json()["error"]["message"]
        not_object = await client.put("/tasks/bad.jsonl", content=b"[1, 2]\n")
        assert not_object.status_code == 400 and "line 1 must be a JSON object" in not_object.json()["error"]["message"]
        empty = await client.put("/tasks/bad.jsonl", content=b"\n\n")
        assert empty.status_code == 400 and "no task" in empty.json()["error"]["message"]
        too_big = await client.put("/tasks/big.jsonl", content=b'{"v": "' + b"x" * (1 << 20) + b'"}\n')
        assert too_big.status_code == 413
    # a refused upload leaves nothing behind, not even a partial file
    assert sorted(p.name for p in (data / "tasks").iterdir()) == []
    assert not (tmp_path / "x.jsonl").exists()


async def test_without_a_data_dir_the_file_routes_say_so(tmp_path) -> None:
    agent = FakeAgent()
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"}))
    async with serve(create_app(cfg, transport=MultiASGITransport({"fake": agent.app()}))) as client:
        upload = await client.put("/tasks/a.jsonl", content=TASKS)
        assert upload.status_code == 404 and "no data_dir" in upload.json()["error"]["message"]
        assert (await client.get("/jobs/current/results")).status_code == 404
