"""``collect --resume`` with no checkpoint: the results file an earlier run left is kept (a last line a kill cut short
dropped), only the (task, repeat) pairs it lacks run, and a file written from other tasks or repeats is refused
(collection/resume.py)."""

from __future__ import annotations

import json

import pytest
from tests.services.collection.test_collection import collection_app, serve, settled_status
from tests.services.collection.test_job_identity import RememberingAgent, rows, write_tasks
from tests.support.asgi import MultiASGITransport

from gym_services.collection.resume import job_file_path


async def _collect(tmp_path, agent: RememberingAgent, spec: dict) -> tuple[int, dict]:
    app = collection_app(agent, transport=MultiASGITransport({"fake": agent.app()}))
    async with serve(app) as client:
        answer = await client.post("/jobs", json=spec)
        if answer.status_code != 200:
            return answer.status_code, answer.json()
        return 200, await settled_status(client)


async def test_resume_runs_only_the_pairs_the_results_lack(tmp_path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", [0.1, 0.2, 0.3, 0.4])
    out = tmp_path / "out.jsonl"
    spec = {"tasks_path": tasks, "output_path": str(out), "repeats": 2}
    code, _ = await _collect(tmp_path, RememberingAgent(), spec)
    assert code == 200
    complete = rows(out)
    assert len(complete) == 8
    # a run killed after three results, its fourth cut short mid-line
    lines = out.read_bytes().split(b"\n")
    out.write_bytes(b"\n".join(lines[:3]) + b"\n" + lines[3][:17])
    kept = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in complete[:3]}

    agent = RememberingAgent()
    code, status = await _collect(tmp_path, agent, {**spec, "resume": True})
    assert code == 200, status
    assert status["kept"] == 3 and status["finished"] == 8 and status["errors"] == 0
    assert len(agent.ran) == 5  # only the missing pairs ran
    ran = {(int(rid.split("-")[0]), int(rid.split("-")[1])) for rid, _ in agent.ran}
    assert not ran & kept
    resumed = rows(out)
    assert resumed[:3] == complete[:3]  # the kept rows are untouched, the cut line is gone
    pairs = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in resumed]
    assert sorted(pairs) == sorted({(t, r) for t in range(4) for r in range(2)})  # each once, none missing
    assert status["mean_reward"] == pytest.approx(sum(r["reward"] for r in resumed) / 8)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"repeats": 3}, "written with 2 repeats per task, this job has 3"),
        ({"tasks": [0.1, 0.2, 0.3, 0.5]}, "written from other tasks"),
        ({"tasks": [0.1, 0.2, 0.3]}, "written from other tasks"),
        ({"drop_job_file": True}, "nothing says which tasks wrote it"),
    ],
)
async def test_resume_refuses_results_of_other_tasks_or_repeats(tmp_path, change, message) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", [0.1, 0.2, 0.3, 0.4])
    out = tmp_path / "out.jsonl"
    code, _ = await _collect(tmp_path, RememberingAgent(), {"tasks_path": tasks, "output_path": str(out), "repeats": 2})
    assert code == 200
    before = out.read_bytes()
    if change.get("drop_job_file"):
        job_file_path(str(out)).unlink()
    if "tasks" in change:
        tasks = write_tasks(tmp_path / "other.jsonl", change["tasks"])
    agent = RememberingAgent()
    spec = {"tasks_path": tasks, "output_path": str(out), "repeats": change.get("repeats", 2), "resume": True}
    code, answer = await _collect(tmp_path, agent, spec)
    assert code == 400, answer
    assert message in answer["error"]["message"] and "--overwrite" in answer["error"]["message"]
    assert out.read_bytes() == before and agent.ran == []  # refused: nothing ran, nothing changed


async def test_resume_refuses_a_row_outside_the_tasks(tmp_path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", [0.1, 0.2])
    out = tmp_path / "out.jsonl"
    code, _ = await _collect(tmp_path, RememberingAgent(), {"tasks_path": tasks, "output_path": str(out)})
    assert code == 200
    with out.open("a") as fh:
        fh.write(json.dumps({"_ng_rollout_id": "0-0", "_ng_task_index": 0, "_ng_rollout_index": 0}) + "\n")
    code, answer = await _collect(
        tmp_path, RememberingAgent(), {"tasks_path": tasks, "output_path": str(out), "resume": True}
    )
    assert code == 400 and "task 0 repeat 0 again" in answer["error"]["message"]


async def test_resume_of_no_results_runs_everything(tmp_path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", [0.1, 0.2])
    out = tmp_path / "none-yet.jsonl"
    agent = RememberingAgent()
    code, status = await _collect(tmp_path, agent, {"tasks_path": tasks, "output_path": str(out), "resume": True})
    assert code == 200 and status["kept"] == 0 and status["finished"] == 2 and len(agent.ran) == 2
