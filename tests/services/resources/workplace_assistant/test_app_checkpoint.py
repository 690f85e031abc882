"""Workplace Assistant over ASGI through its real routes and control routes: checkpoint after k tool
calls, restore into a fresh app with the same cookies, continue — every output, every table and the
reward equal an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.resources.workplace_assistant.app import Config, create_app
from gym_services.resources.workplace_assistant.compare import table_differences
from gym_services.resources.workplace_assistant.environment import WorkplaceEnvironment

DATA = Path(__file__).resolve().parents[4] / "services/gym_services/resources/workplace_assistant/data/example.jsonl"
TASKS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
# Reads and a plot (appended by label) and a None stored over a NaN cell, then the task's own actions.
PROLOGUE = [
    ("email_search_emails", {"query": "update"}),
    (
        "analytics_create_plot",
        {"time_min": "2023-10-22", "time_max": "2023-11-01", "value_to_plot": "total_visits", "plot_type": "bar"},
    ),
    ("customer_relationship_manager_search_customers", {"customer_name": "a"}),
]


def app():
    return create_app(load_config(Config, overrides=base_config("workplace_assistant")))


def calls_for(task) -> list[tuple[str, dict]]:
    return PROLOGUE + [
        (a["name"], json.loads(a["arguments"]) if isinstance(a["arguments"], str) else a["arguments"])
        for a in task["ground_truth"]
    ]


def response_for(calls) -> dict:
    return {
        "id": "resp_1",
        "created_at": 1,
        "model": "m",
        "object": "response",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {"type": "function_call", "name": n, "arguments": json.dumps(a), "call_id": f"c{i}"}
            for i, (n, a) in enumerate(calls)
        ],
    }


def verify_body(task, calls) -> dict:
    """A verify request as NeMo Gym's agent posts it: the task row and the response."""
    return {**task, "response": response_for(calls)}


def tables(client) -> dict[str, pd.DataFrame]:
    sessions = client._transport.app.state.participant.hooks
    env: WorkplaceEnvironment = sessions.get(sessions.session_ids()[0])
    return {k: df.copy() for k, df in env.items()}


async def run_uninterrupted(task) -> tuple[list[str], dict, dict]:
    calls = calls_for(task)
    async with serve(app()) as client:
        await client.post("/seed_session", json={})
        outputs = [(await client.post(f"/{n}", json=a)).text for n, a in calls]
        final_tables = tables(client)
        verify = (await client.post("/verify", json=verify_body(task, calls[len(PROLOGUE) :]))).json()
    return outputs, final_tables, verify


@pytest.mark.parametrize("task_index", range(len(TASKS)))
@pytest.mark.parametrize("cut", [0, 1, 2, 4])
@pytest.mark.parametrize("method", ["sync", "background"])
async def test_restore_continues_like_uninterrupted(storage_url, task_index, cut, method) -> None:
    task = TASKS[task_index]
    calls = calls_for(task)
    cut = min(cut, len(calls))
    expected_outputs, expected_tables, expected_verify = await run_uninterrupted(task)
    assert expected_verify["reward"] == 1.0
    ident = {"x-ng-rollout-id": f"t{task_index}", "x-ng-attempt": "0"}
    async with serve(app()) as client:
        seed = await client.post("/seed_session", json={}, headers=ident)
        assert seed.headers["x-ng-checkpoint-verify"] == "wait"
        outputs = [(await client.post(f"/{n}", json=a, headers=ident)).text for n, a in calls[:cut]]
        cookies = dict(client.cookies)
        control = Control(client)
        if method == "sync":
            committed = await control.checkpoint("ck", storage_url, episodes=[f"t{task_index}"])
        else:  # captured under the pause, encoded and written after resume: the session goes on meanwhile
            prepared = await control.prepare("ck")
            assert prepared["status"] == "prepared", prepared
            await control.call(
                "capture", {"checkpoint_id": "ck", "location": storage_url, "episodes": [f"t{task_index}"]}
            )
            await control.resume("ck")
            if cut < len(calls):  # a call after resume must not reach the captured state
                await client.post(f"/{calls[cut][0]}", json=calls[cut][1], headers=ident)
            committed = await control.call("persist", {"checkpoint_id": "ck"})
        assert committed["records"] == 2  # the session and the shared pristine base
    nxt = {"x-ng-rollout-id": f"t{task_index}", "x-ng-attempt": "1"}
    async with serve(app()) as client:
        control = Control(client)
        await control.restore("ck", storage_url, committed["manifest_key"], committed["manifest_sha256"])
        await control.resume("ck")
        client.cookies.update(cookies)
        late = await client.post(f"/{calls[0][0]}", json=calls[0][1], headers=ident)
        assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
        outputs += [(await client.post(f"/{n}", json=a, headers=nxt)).text for n, a in calls[cut:]]
        restored_tables = tables(client)
        verify = (await client.post("/verify", headers=nxt, json=verify_body(task, calls[len(PROLOGUE) :]))).json()
        assert (await control.status())["live"] == {"sessions": 0}
    assert outputs == expected_outputs
    assert verify == expected_verify
    assert restored_tables.keys() == expected_tables.keys()
    for key in expected_tables:
        # strict: assert_frame_equal would treat None and NaN as equal
        assert table_differences(restored_tables[key], expected_tables[key]) == [], key


async def test_session_errors_and_retire(tmp_path) -> None:
    async with serve(app()) as client:
        unknown = await client.post("/email_search_emails", json={"query": "x"})
        assert unknown.status_code == 400  # NeMo Gym's answer for a session never seeded
        assert unknown.text == '{"detail":"Session not initialized. Please call seed_session first."}'
        await client.post("/seed_session", json={}, headers={"x-ng-rollout-id": "a"})
        a = dict(client.cookies)
        bad_tool = await client.post("/no_such_tool", json={})
        assert bad_tool.status_code == 200
        assert bad_tool.text == "{\"output\":\"Error executing tool 'no_such_tool': 'no_such_tool'\"}"
        text = await client.post("/email_get_email_information_by_id", json={"email_id": "nope", "field": "body"})
        assert text.status_code == 200 and text.text == '{"output":"Email not found."}'
        bad_json = await client.post(
            "/email_search_emails", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 422 and bad_json.json()["detail"][0]["type"] == "json_invalid"
        client.cookies.clear()
        await client.post("/seed_session", json={}, headers={"x-ng-rollout-id": "b"})
        b = dict(client.cookies)
        await Control(client).retire("a", 0)
        client.cookies.clear()
        client.cookies.update(a)
        gone = await client.post("/email_search_emails", json={"query": "x"})
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "stale_attempt"
        client.cookies.clear()
        client.cookies.update(b)
        assert (await client.post("/email_search_emails", json={"query": "update"})).status_code == 200
        committed = await Control(client).checkpoint("ck", f"file://{tmp_path}")
        assert committed["episodes"] == ["b"]


async def test_bad_verify_input_is_refused_and_keeps_the_session() -> None:
    async with serve(app()) as client:
        await client.post("/seed_session", json={})
        good = verify_body(TASKS[0], [])
        for body in (
            {**good, "response": {**good["response"], "output": "x"}},
            {**good, "id": "x"},
            {k: v for k, v in good.items() if k != "ground_truth"},
            {},
        ):
            refused = await client.post("/verify", json=body)
            assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][0] == "body"
        assert (await client.post("/email_search_emails", json={"query": "x"})).status_code == 200


async def test_failed_verify_session_left_out_of_commit(tmp_path, monkeypatch) -> None:
    from gym_services.resources.workplace_assistant import verify as grading

    def explode(*args, **kwargs):
        raise RuntimeError("grader crashed")

    monkeypatch.setattr(grading, "is_correct", explode)
    async with serve(app()) as client:
        await client.post("/seed_session", json={}, headers={"x-ng-rollout-id": "a"})
        a = dict(client.cookies)
        client.cookies.clear()
        await client.post("/seed_session", json={}, headers={"x-ng-rollout-id": "b"})
        client.cookies.clear()
        client.cookies.update(a)
        broken = await client.post("/verify", json=verify_body(TASKS[0], []))
        assert broken.status_code == 500  # verify raised...
        participant = client._transport.app.state.participant
        assert participant.live() == {"sessions": 2}  # ...the participant still tracks it, the server dropped it
        committed = await Control(client).checkpoint("ck", f"file://{tmp_path}")
        assert committed["episodes"] == ["b"] and committed["records"] == 2
