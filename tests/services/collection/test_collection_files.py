"""A collection server with a data_dir (its PersistentVolume on Kubernetes): tasks uploaded over HTTP, job
paths confined to the folder, results read back as checkpointed — the way `gymckpt collect --url` drives it."""

from __future__ import annotations

import asyncio
import json

from tests.services.collection.test_collection import FakeAgent, serve, settled_status
from tests.support.asgi import JOB_AUTH, MultiASGITransport, base_config
from tests.support.asgi import serve as serve_app

from gym_services.base.config import load_config
from gym_services.collection.app import Config, create_app

TASKS = "".join(json.dumps({"value": i / 10, "agent": "fake"}) + "\n" for i in range(4)).encode()


def app_with_data_dir(agent: FakeAgent, data_dir, **extra):
    cfg = load_config(
        Config, overrides=base_config("collection", agents={"fake": "http://fake"}, data_dir=str(data_dir), **extra)
    )
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
        started = await client.post(
            "/jobs", json={"tasks_path": "tasks/mine.jsonl", "output_path": "results/r1.jsonl", "concurrency": 2}
        )
        assert started.status_code == 200 and started.json()["output_path"] == str(
            (data / "results/r1.jsonl").resolve()
        )
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
        for spec in (
            {"tasks_path": str(outside), "output_path": "results/x.jsonl"},
            {"tasks_path": "../outside.jsonl", "output_path": "results/x.jsonl"},
            {"tasks_path": "tasks/a.jsonl", "output_path": "/tmp/elsewhere.jsonl"},
        ):
            refused = await client.post("/jobs", json=spec)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
            assert "is outside the folders this server may use" in refused.json()["error"]["message"]
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


JOB_ROUTES = [("POST", "/jobs"), ("GET", "/jobs/current"), ("GET", "/jobs/current/results"), ("PUT", "/tasks/a.jsonl")]


async def test_job_routes_need_the_job_token(tmp_path) -> None:
    """Submitting, following, uploading and downloading all need the bearer token."""
    agent = FakeAgent()
    data = tmp_path / "data"
    victim = data / "results/x.jsonl"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"kept\n")
    spec = {"tasks_path": "tasks/a.jsonl", "output_path": "results/x.jsonl"}
    (data / "tasks").mkdir()
    (data / "tasks/a.jsonl").write_bytes(TASKS)
    async with serve_app(app_with_data_dir(agent, data)) as client:  # no token
        for method, path in JOB_ROUTES:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic eDp5"}):
                resp = await client.request(
                    method,
                    path,
                    json=spec if path == "/jobs" else None,
                    content=TASKS if method == "PUT" else None,
                    headers=headers,
                )
                assert resp.status_code == 401, (method, path, headers, resp.text)
                assert resp.json()["error"]["code"] == "unauthorized" and "job" in resp.json()["error"]["message"]
        # nothing was started, uploaded or truncated
        assert agent.calls == [] and victim.read_bytes() == b"kept\n" and (data / "tasks/a.jsonl").read_bytes() == TASKS
        assert sorted(p.name for p in (data / "tasks").iterdir()) == ["a.jsonl"]
        assert (await client.post("/jobs", json=spec, headers=JOB_AUTH)).status_code == 200  # the right token works


async def test_a_job_token_of_its_own_replaces_the_control_token(tmp_path) -> None:
    agent = FakeAgent()
    async with serve_app(app_with_data_dir(agent, tmp_path / "data", job_token="the-job-token-0123")) as client:
        control = await client.get("/jobs/current", headers=JOB_AUTH)
        assert control.status_code == 401
        own = await client.get("/jobs/current", headers={"authorization": "Bearer the-job-token-0123"})
        assert own.status_code == 200 and own.json()["state"] == "idle"


async def test_without_job_folders_every_job_is_forbidden(tmp_path) -> None:
    """A collection server that was given no folder reads and writes nothing."""
    agent = FakeAgent()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(TASKS)
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(b"precious\n")
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"}))
    async with serve(create_app(cfg, transport=MultiASGITransport({"fake": agent.app()}))) as client:
        refused = await client.post("/jobs", json={"tasks_path": str(tasks), "output_path": str(victim)})
    assert refused.status_code == 403 and "no folder for job files: set data_dir or job_dirs" in refused.text
    assert victim.read_bytes() == b"precious\n" and agent.calls == []


async def test_job_paths_are_confined_to_job_dirs_and_errors_echo_no_content(tmp_path) -> None:
    """``tasks_path`` and ``output_path`` outside the configured folders are 403 (symbolic links
    followed); nothing outside is read, truncated or echoed."""
    agent = FakeAgent()
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"agent": "SECRET-VALUE-1", "password": "SECRET-VALUE-2"}\n')
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(b"precious\n")
    (jobs / "link.jsonl").symlink_to(secret)
    (jobs / "out-link.jsonl").symlink_to(victim)
    (jobs / "tasks.jsonl").write_bytes(TASKS)
    (jobs / "not-json.jsonl").write_text('{"ok": 1}\nSECRET-VALUE-3 is not json\n')
    (jobs / "unknown-agent.jsonl").write_text('{"agent": "SECRET-VALUE-4"}\n')
    (jobs / "binary.jsonl").write_bytes(b'{"a": "\xff\xfeSECRET-VALUE-5"}\n')
    cfg = load_config(Config, overrides=base_config("collection", agents={"fake": "http://fake"}, job_dirs=[str(jobs)]))
    async with serve(create_app(cfg, transport=MultiASGITransport({"fake": agent.app()}))) as client:
        answers = []
        for tasks_path, output_path, status in [
            (str(secret), str(jobs / "out.jsonl"), 403),
            ("/etc/passwd", str(jobs / "out.jsonl"), 403),
            ("../secret.jsonl", str(jobs / "out.jsonl"), 403),
            (str(jobs / "link.jsonl"), str(jobs / "out.jsonl"), 403),
            (str(jobs / "tasks.jsonl"), str(victim), 403),
            (str(jobs / "tasks.jsonl"), str(jobs / "out-link.jsonl"), 403),
            (str(jobs / "tasks.jsonl"), str(jobs / "../victim.jsonl"), 403),
            (str(jobs / "not-json.jsonl"), str(jobs / "out.jsonl"), 400),
            (str(jobs / "unknown-agent.jsonl"), str(jobs / "out.jsonl"), 400),
            (str(jobs / "binary.jsonl"), str(jobs / "out.jsonl"), 400),
            (str(jobs), str(jobs / "out.jsonl"), 400),
        ]:
            resp = await client.post("/jobs", json={"tasks_path": tasks_path, "output_path": output_path})
            assert resp.status_code == status, (tasks_path, output_path, resp.text)
            answers.append(resp.text)
        assert all("SECRET-VALUE" not in text and "root:" not in text for text in answers), answers
        assert "is outside the folders this server may use" in answers[0]
        started = await client.post("/jobs", json={"tasks_path": "tasks.jsonl", "output_path": "out.jsonl"})
        assert started.status_code == 200 and started.json()["output_path"] == str((jobs / "out.jsonl").resolve())
    assert victim.read_bytes() == b"precious\n"
