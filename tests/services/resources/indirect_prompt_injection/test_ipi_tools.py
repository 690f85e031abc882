"""Tool routes: output formats of the recorded rollouts, per-domain behaviour, errors."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from gym_services.resources.indirect_prompt_injection.tools import DOMAINS, TOOLS
from tests.services.resources.indirect_prompt_injection.scenarios import TASKS, fresh_app, load_rollouts
from tests.support.asgi import serve


async def seeded(client: httpx.AsyncClient, environment: dict) -> None:
    client.cookies.clear()
    resp = await client.post("/seed_session", json={"environment": environment})
    assert resp.status_code == 200, resp.text


async def out(client: httpx.AsyncClient, tool: str, **args) -> str:
    resp = await client.post(f"/{tool}", json=args)
    assert resp.status_code == 200, resp.text
    return resp.json()["output"]


def test_every_declared_tool_is_implemented_in_its_domain() -> None:
    for task in TASKS:
        names = {tool["name"] for tool in task["responses_create_params"]["tools"]}
        assert names <= set(DOMAINS[task["domain"]]), names - set(DOMAINS[task["domain"]])
        assert names <= set(TOOLS)


@pytest.mark.parametrize("rollout_index", range(5))
async def test_recorded_rollouts_tool_outputs_match_byte_for_byte(rollout_index: int) -> None:
    """Replay each recorded rollout's calls on a healthcare task: the bodies equal the recorded outputs."""
    rollout = load_rollouts()[rollout_index]
    items = rollout["response"]["output"]
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    calls = [i for i in items if i["type"] == "function_call"]
    assert calls
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[0]["environment"])
        for call in calls:
            resp = await client.post(f"/{call['name']}", content=call["arguments"])
            assert resp.text == outputs[call["call_id"]]


async def test_seed_reply_and_errors() -> None:
    async with serve(fresh_app(max_environment_bytes=5000)) as client:
        resp = await client.post("/get_messages", json={})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "session_not_found"
        for body in ({}, {"environment": []}, [1]):
            bad = await client.post("/seed_session", json=body)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_request"
        huge = await client.post("/seed_session", json={"environment": {"x": "y" * 6000}})
        assert huge.status_code == 400 and "limit is 5000" in huge.json()["error"]["message"]
        seed = await client.post("/seed_session", json=TASKS[1])
        assert seed.status_code == 200 and seed.json() == {} and seed.headers["x-ng-checkpoint-verify"] == "wait"
        assert (await client.post("/get_messages", content=b"[1, 2]")).status_code == 400
        assert (await client.post("/get_messages", content=b"{not json")).status_code == 400
        assert await out(client, "no_such_tool") == "Unknown tool: no_such_tool"
        assert await out(client, "get_schedule", day="x") == (
            "Error executing tool 'get_schedule' (TypeError): get_schedule() got an unexpected keyword argument 'day'"
        )
        assert await out(client, "get_schedule") == (
            "Error executing tool 'get_schedule' (TypeError): get_schedule() missing 1 required positional argument: 'date'"
        )
        # None arguments are dropped, as if not given
        assert await out(client, "get_messages", anything=None) == "[]"


async def test_healthcare_tools() -> None:
    env = TASKS[1]["environment"]
    async with serve(fresh_app()) as client:
        await seeded(client, env)
        assert json.loads(await out(client, "search_patients", query="DIABETES")) == [
            {"patient_id": "P002", "name": "James Wilson"}
        ]
        assert json.loads(await out(client, "get_patient_record", patient_id="P001")) == env["patients"]["P001"]
        assert await out(client, "update_patient_chart", patient_id="P001", notes="Peak flow 420.") == (
            "Chart updated for patient P001."
        )
        record = json.loads(await out(client, "get_patient_record", patient_id="P001"))
        assert record["chart_notes"] == "Using inhaler as needed.\nPeak flow 420."
        assert await out(client, "update_patient_chart", patient_id="P9", notes="x") == "Error: Patient P9 not found."
        assert [a["appointment_id"] for a in json.loads(await out(client, "get_schedule", date="2024-06-24"))] == [
            "APT-1101",
            "APT-2205",
            "APT-3309",
        ]
        assert await out(client, "cancel_appointment", appointment_id="APT-3309") == (
            "Appointment APT-3309 has been cancelled."
        )
        assert await out(client, "cancel_appointment", appointment_id="APT-0") == "Error: Appointment APT-0 not found."
        schedule = json.loads(await out(client, "get_schedule", date="2024-06-24"))
        assert schedule[2]["status"] == "cancelled"
        booked = await out(client, "schedule_appointment", patient_id="P001", date="2024-07-01", time="09:00", reason="r")
        assert booked.startswith("Appointment APT-") and booked.endswith(" scheduled for patient P001 on 2024-07-01 at 09:00.")
        new_id = booked.split()[1]
        assert json.loads(await out(client, "get_schedule", date="2024-07-01")) == [
            {
                "appointment_id": new_id,
                "patient_id": "P001",
                "date": "2024-07-01",
                "time": "09:00",
                "reason": "r",
                "status": "scheduled",
            }
        ]
        assert await out(client, "send_referral", patient_id="P002", specialist_email="e@x", reason="r") == (
            "Referral sent for patient P002 to e@x."
        )
        assert await out(client, "prescribe_medication", patient_id="P002", medication="M", dosage="1mg", instructions="i") == (
            "Prescribed M 1mg for patient P002."
        )
        assert json.loads(await out(client, "get_prescriptions", patient_id="P002")) == [
            {"medication": "M", "dosage": "1mg", "instructions": "i"}
        ]
        assert await out(client, "get_prescriptions", patient_id="P001") == "[]"
        assert await out(client, "get_lab_results", patient_id="P001") == "[]"
        assert await out(client, "send_message", recipient="n@x", subject="s", body="b") == "Message sent to n@x."
        assert json.loads(await out(client, "get_messages")) == [
            {"from": "o.hassan@clinic.example.com", "to": "n@x", "subject": "s", "body": "b", "timestamp": "sent"}
        ]
        assert await out(client, "send_message", subject="s", body="b") == (
            "Error executing tool 'send_message' (ValueError): send_message needs a recipient"
        )
        store = client._transport.app.state.sessions
        (session,) = store.sessions.values()
        assert session.environment["sent_actions"] == [
            {"type": "referral", "patient_id": "P002", "specialist_email": "e@x", "reason": "r"}
        ]
        assert env["appointments"]["APT-3309"].get("status") is None  # the task row is untouched


async def test_messages_stored_as_dict_get_minted_ids() -> None:
    env = copy.deepcopy(TASKS[0]["environment"])
    env["messages"] = {"m1": {"message_id": "m1", "to": "a"}}
    async with serve(fresh_app()) as client:
        await seeded(client, env)
        assert await out(client, "send_message", to=["a@x", "b@x"], subject="s", body="b", case_id="C1") == (
            "Message sent to a@x, b@x."
        )
        messages = json.loads(await out(client, "get_messages"))
        assert messages[0] == {"message_id": "m1", "to": "a"}
        assert messages[1]["message_id"].startswith("MSG-") and messages[1]["to"] == ["a@x", "b@x"]
        assert messages[1]["case_id"] == "C1" and messages[1]["from"] == "..."


async def test_hr_tools() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[3]["environment"])
        assert json.loads(await out(client, "search_candidates", query="sql")) == [
            {"candidate_id": "C-4551", "name": "Jordan Lee"}
        ]
        assert await out(client, "search_candidates", query="data", status="hired") == "[]"
        assert json.loads(await out(client, "search_candidates", query="data", status="APPLIED"))[2]["candidate_id"] == "C-4553"
        assert json.loads(await out(client, "get_candidate_profile", candidate_id="C-0")) == {"error": "Candidate C-0 not found."}
        missing = await out(client, "update_candidate_status", candidate_id="C-0", status="hired")
        assert missing == "Error: Candidate C-0 not found."
        booked = await out(
            client, "schedule_interview", candidate_id="C-4551", interviewer_email="i@x", date="2024-06-01", time="10:00"
        )
        interview_id = booked.split()[1]
        assert interview_id.startswith("I-") and booked.endswith("for candidate C-4551 on 2024-06-01 at 10:00.")
        assert await out(client, "get_interview_schedule", date="2024-06-02") == "[]"
        assert await out(client, "submit_interview_feedback", candidate_id="C-4551", feedback="good", rating=4) == (
            "Feedback submitted for candidate C-4551."
        )
        assert json.loads(await out(client, "get_interview_schedule")) == [
            {
                "interview_id": interview_id,
                "candidate_id": "C-4551",
                "interviewer_email": "i@x",
                "date": "2024-06-01",
                "time": "10:00",
                "status": "scheduled",
                "feedback": "good",
                "rating": 4,
            }
        ]
        assert await out(client, "send_offer", candidate_id="C-4551", position="DA", salary="1", start_date="d") == (
            "Offer sent to candidate C-4551 for position 'DA'."
        )
        assert await out(client, "send_email", recipient="r@x", subject="s", body="b") == "Email sent to r@x."
        assert json.loads(await out(client, "get_inbox")) == [
            {"from": "c.reynolds@company.example.com", "to": "r@x", "subject": "s", "body": "b", "timestamp": "sent"}
        ]
        created = await out(client, "create_job_posting", title="T", description="D", requirements="R")
        assert created.startswith("Job posting 'T' created with ID POS-")
        positions = json.loads(await out(client, "get_open_positions"))
        assert [p["position_id"] for p in positions] == ["POS-789", created.rsplit(" ", 1)[1].rstrip(".")]

        await seeded(client, TASKS[4]["environment"])  # inbox stored as a dict keyed by message id
        assert await out(client, "send_email", recipient="r@x", subject="s", body="b") == "Email sent to r@x."
        inbox = json.loads(await out(client, "get_inbox"))
        assert [m["message_id"] for m in inbox][:2] == ["msg-7890", "msg-7891"] and inbox[2]["message_id"].startswith("MSG-")
        assert await out(client, "submit_interview_feedback", candidate_id="C-1104", feedback="f", rating=5) == (
            "Feedback submitted for candidate C-1104."
        )
        (interview,) = json.loads(await out(client, "get_interview_schedule"))
        assert interview["candidate_id"] == "C-1104" and interview["interview_id"].startswith("I-")


async def test_reseed_replaces_environment_and_metrics_count_calls() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[1]["environment"])
        await out(client, "send_message", recipient="n@x", subject="s", body="b")
        again = await client.post("/seed_session", json=TASKS[1])  # same cookie
        assert again.status_code == 200
        assert await out(client, "get_messages") == "[]"
        await out(client, "no_such_tool")
        metrics = (await client.get("/metrics")).text
        assert 'ipi_tool_calls_total{outcome="ok",tool="send_message"} 1.0' in metrics
        assert 'ipi_tool_calls_total{outcome="unknown_tool",tool="unknown"} 1.0' in metrics
