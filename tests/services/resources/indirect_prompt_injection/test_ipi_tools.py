"""Tool routes: every domain's tools, the answers NeMo Gym's server gives to odd calls, body errors.

The conformance suite (``tests/conformance/test_ipi_conformance.py``) compares every answer with the
reference byte for byte; these tests state the behaviour in readable examples and run without it.
"""

from __future__ import annotations

import copy
import json
import re

import httpx
import pytest
from tests.services.resources.indirect_prompt_injection.scenarios import TASK_OF_DOMAIN, TASKS, fresh_app, load_rollouts
from tests.support.asgi import serve

from gym_services.resources.indirect_prompt_injection import schemas
from gym_services.resources.indirect_prompt_injection.tools import DOMAINS, TOOLS

HEX6 = "[0-9A-F]{6}"


async def seeded(client: httpx.AsyncClient, environment: dict) -> None:
    client.cookies.clear()
    resp = await client.post("/seed_session", json={"environment": environment})
    assert resp.status_code == 200, resp.text


async def out(client: httpx.AsyncClient, tool: str, **args) -> str:
    resp = await client.post(f"/{tool}", json=args)
    assert resp.status_code == 200, resp.text
    return resp.json()["output"]


def env_of(domain: str) -> dict:
    return copy.deepcopy(TASKS[TASK_OF_DOMAIN[domain]]["environment"])


def test_every_declared_tool_is_implemented_in_its_domain() -> None:
    assert len(TOOLS) == 97 and set(DOMAINS) == {task["domain"] for task in TASKS}
    for task in TASKS:
        names = {tool["name"] for tool in task["responses_create_params"]["tools"]}
        assert names <= set(DOMAINS[task["domain"]]), names - set(DOMAINS[task["domain"]])


def test_tool_definitions_cover_every_tool() -> None:
    assert set(schemas.SPECS) == set(TOOLS)
    for task in TASKS[5:]:  # our tasks offer exactly their domain's tools, as defined in schemas.py
        assert task["responses_create_params"]["tools"] == schemas.domain_tools(list(DOMAINS[task["domain"]]))


@pytest.mark.parametrize("rollout_index", range(5))
async def test_recorded_rollouts_tool_outputs_match_byte_for_byte(rollout_index: int) -> None:
    """Each recorded rollout's calls on a healthcare task: the bodies equal the recorded outputs."""
    items = load_rollouts()[rollout_index]["response"]["output"]
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    calls = [i for i in items if i["type"] == "function_call"]
    assert calls
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[0]["environment"])
        for call in calls:
            resp = await client.post(
                f"/{call['name']}", content=call["arguments"], headers={"content-type": "application/json"}
            )
            assert resp.text == outputs[call["call_id"]]


async def test_seed_and_body_errors_answer_like_fastapi() -> None:
    async with serve(fresh_app(max_environment_bytes=5000)) as client:
        resp = await client.post("/get_messages", json={})
        assert resp.status_code == 400
        assert resp.json() == {"detail": "Session not initialized. Please call seed_session first."}
        missing = await client.post("/seed_session", json={})
        assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "environment"]
        assert (await client.post("/seed_session", json={"environment": []})).json()["detail"][0]["type"] == "dict_type"
        huge = await client.post("/seed_session", json={"environment": {"x": "y" * 6000}})
        assert huge.status_code == 413 and "limit is 5000" in huge.json()["error"]["message"]
        seed = await client.post("/seed_session", json=TASKS[1])
        assert seed.status_code == 200 and seed.content == b"{}" and seed.headers["x-ng-checkpoint-verify"] == "wait"
        json_type = {"content-type": "application/json"}
        not_object = await client.post("/get_messages", content=b"[1, 2]", headers=json_type)
        assert not_object.status_code == 422 and not_object.json()["detail"][0]["type"] == "model_attributes_type"
        bad_json = await client.post("/get_messages", content=b"{not json", headers=json_type)
        assert bad_json.json() == {
            "detail": [
                {
                    "type": "json_invalid",
                    "loc": ["body", 1],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": "Expecting property name enclosed in double quotes"},
                }
            ]
        }
        empty = await client.post("/get_messages", content=b"", headers=json_type)
        assert empty.json()["detail"][0]["type"] == "missing"
        text = await client.post("/get_messages", content=b"{}", headers={"content-type": "text/plain"})
        assert text.status_code == 422  # only JSON content types are read as JSON
        assert (await client.get("/get_messages")).json() == {"detail": "Method Not Allowed"}
        assert (await client.post("/a/b", json={})).json() == {"detail": "Not Found"}
        assert await out(client, "no_such_tool") == "Unknown tool: no_such_tool"
        assert await out(client, "get_schedule", day="x") == (
            "Error executing tool 'get_schedule' (TypeError): get_schedule() got an unexpected keyword argument 'day'"
        )
        assert await out(client, "schedule_appointment", patient_id="P1") == (
            "Error executing tool 'schedule_appointment' (TypeError): schedule_appointment() missing 3 required "
            "positional arguments: 'date', 'time', and 'reason'"
        )
        assert await out(client, "get_patient_record", patient_id="P1", env={}) == (
            "Error executing tool 'get_patient_record' (TypeError): get_patient_record() got multiple values for "
            "argument 'env'"
        )
        # null arguments count as absent; tools taking **kwargs ignore unknown ones
        assert await out(client, "get_messages", anything=None, other=1) == "[]"


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
        assert await out(client, "update_patient_chart", patient_id="P001", notes=7) == (
            "Error executing tool 'update_patient_chart' (TypeError): can only concatenate str (not \"int\") to str"
        )
        assert await out(client, "update_patient_chart", patient_id="P9", notes="x") == "Error: Patient P9 not found."
        assert (
            await out(client, "cancel_appointment", appointment_id="APT-3309")
            == "Appointment APT-3309 has been cancelled."
        )
        assert json.loads(await out(client, "get_schedule", date="2024-06-24"))[2]["status"] == "cancelled"
        booked = await out(
            client, "schedule_appointment", patient_id="P001", date="2024-07-01", time="09:00", reason="r"
        )
        assert re.fullmatch(f"Appointment A{HEX6} scheduled for patient P001 on 2024-07-01 at 09:00.", booked), booked
        assert (
            json.loads(await out(client, "get_schedule", date="2024-07-01"))[0]["appointment_id"] == booked.split()[1]
        )
        assert await out(client, "send_referral", patient_id="P002", specialist_email="e@x", reason="r") == (
            "Referral sent for patient P002 to e@x."
        )
        assert await out(
            client, "prescribe_medication", patient_id="P002", medication="M", dosage="1mg", instructions="i"
        ) == ("Prescribed M 1mg for patient P002.")
        assert json.loads(await out(client, "get_prescriptions", patient_id="P002")) == [
            {"medication": "M", "dosage": "1mg", "instructions": "i"}
        ]
        assert await out(client, "get_lab_results", patient_id="P001") == "[]"
        # the addressee is recipient, to or recipients (a list is joined); none at all is "unknown"
        assert await out(client, "send_message", recipient="n@x", subject="s", body="b") == "Message sent to n@x."
        assert (
            await out(client, "send_message", recipients=["a@x", "b@x"], to="", body="b") == "Message sent to a@x, b@x."
        )
        assert await out(client, "send_message", subject="no one") == "Message sent to unknown."
        sent = json.loads(await out(client, "get_messages"))
        assert sent[0] == {
            "from": "o.hassan@clinic.example.com",
            "to": "n@x",
            "subject": "s",
            "body": "b",
            "timestamp": "sent",
        }
        assert [m["to"] for m in sent] == ["n@x", "a@x, b@x", "unknown"]
        assert json.loads(await out(client, "get_messages", to="A@X, B@X")) == [sent[1]]
        assert env["appointments"]["APT-3309"].get("status") is None  # the task row is untouched


async def test_dict_mailboxes() -> None:
    env = copy.deepcopy(TASKS[0]["environment"])
    env["messages"] = {"m1": {"message_id": "m1", "to": "a"}}
    async with serve(fresh_app()) as client:
        await seeded(client, env)
        assert (
            await out(client, "send_message", to="a@x", subject="s", body="b", case_id="C1") == "Message sent to a@x."
        )
        messages = json.loads(await out(client, "get_messages"))
        assert messages[0] == {"message_id": "m1", "to": "a"}
        assert list(messages[1]) == ["from", "to", "subject", "body", "timestamp", "case_id", "message_id"]
        assert re.fullmatch(f"MSG-{HEX6}", messages[1]["message_id"])
        # HR: mail is appended to the inbox, which a dict cannot take (NeMo Gym answers with the error)
        await seeded(client, TASKS[4]["environment"])
        assert await out(client, "send_email", recipient="r@x", subject="s", body="b") == (
            "Error executing tool 'send_email' (AttributeError): 'dict' object has no attribute 'append'"
        )
        inbox = json.loads(await out(client, "get_inbox"))
        assert list(inbox) == ["msg-7890", "msg-7891"]  # the inbox as stored


async def test_hr_tools() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[3]["environment"])
        assert json.loads(await out(client, "search_candidates", query="sql")) == [
            {"candidate_id": "C-4551", "name": "Jordan Lee"}
        ]
        assert await out(client, "search_candidates", query="data", status="hired") == "[]"
        assert json.loads(await out(client, "get_candidate_profile", candidate_id="C-0")) == {
            "error": "Candidate C-0 not found."
        }
        booked = await out(
            client,
            "schedule_interview",
            candidate_id="C-4551",
            interviewer_email="i@x",
            date="2024-06-01",
            time="10:00",
        )
        assert re.fullmatch(f"Interview I-{HEX6} scheduled for candidate C-4551 on 2024-06-01 at 10:00.", booked)
        assert await out(client, "submit_interview_feedback", candidate_id="C-4551", feedback="good", rating=4) == (
            "Feedback submitted for candidate C-4551."
        )
        (interview,) = json.loads(await out(client, "get_interview_schedule"))
        assert (interview["interview_id"], interview["feedback"], interview["rating"]) == (booked.split()[1], "good", 4)
        assert await out(client, "send_offer", candidate_id="C-4551", position="DA", salary="1", start_date="d") == (
            "Offer sent to candidate C-4551 for position 'DA'."
        )
        assert await out(client, "send_email", recipient="r@x", subject="s", body="b") == "Email sent to r@x."
        assert json.loads(await out(client, "get_inbox"))[-1]["to"] == "r@x"
        created = await out(client, "create_job_posting", title="T", description="D", requirements="R")
        assert re.fullmatch(f"Job posting 'T' created with ID POS-{HEX6}.", created)


async def test_ecommerce_and_education_tools() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, env_of("ecommerce"))
        assert [o["order_id"] for o in json.loads(await out(client, "search_orders", status="SHIPPED"))] == ["O-2231"]
        assert await out(client, "add_order_note", order_id="O-2232", note="n") == "Note added to order O-2232."
        assert await out(client, "process_refund", refund_id="R-1", amount=5) == "Refund R-1 processed for $5."
        assert re.fullmatch(
            f"Support ticket T-{HEX6} created.",
            await out(client, "create_support_ticket", customer_id="C", subject="s", description="d"),
        )
        assert await out(client, "update_product_stock", product_id="P-7002", stock_quantity=2.5) == (
            "Stock updated for product P-7002 to 2.5."
        )
        await seeded(client, env_of("education"))
        assert [s["student_id"] for s in json.loads(await out(client, "search_students", name="MIA C"))] == ["S-4410"]
        adjusted = json.loads(await out(client, "adjust_financial_aid", aid_id="FA-88", status="review"))
        assert adjusted == {
            "aid_id": "FA-88",
            "student_id": "S-4411",
            "type": "grant",
            "amount": 4200,
            "status": "review",
        }
        assert json.loads(await out(client, "adjust_financial_aid", aid_id="X")) == {
            "error": "Financial aid record X not found."
        }


async def test_insurance_it_and_legal_tools() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, env_of("insurance"))
        note = json.loads(await out(client, "add_adjuster_note", claim_id="CL-7701", adjuster_id="A", note_text="t"))
        assert (
            list(note) == ["note_id", "claim_id", "adjuster_id", "note_text", "timestamp"]
            and note["timestamp"] == "created"
        )
        claim = json.loads(
            await out(
                client,
                "create_claim",
                policy_id="POL-310",
                claim_number="1",
                date_of_loss="d",
                description="x",
                claim_type="t",
                amount_requested=1,
                adjuster_id="A",
            )
        )
        assert re.fullmatch(f"CL-{HEX6}", claim["claim_id"]) and claim["status"] == "open"
        await seeded(client, env_of("it_helpdesk"))
        assert [a["asset_id"] for a in json.loads(await out(client, "search_assets", tag="lap", status="IN USE"))] == [
            "AS-501"
        ]
        assert re.fullmatch(
            f"Incident INC-{HEX6} created.",
            await out(client, "create_incident", title="t", description="d", priority="Low", assigned_to="me"),
        )
        await seeded(client, env_of("legal"))
        await out(
            client, "add_billing_entry", case_id="CASE-204", date="2025-04-01", description="d", hours=2, rate=150.5
        )
        (entry,) = json.loads(await out(client, "get_billing_report", start_date="2025-01-01"))
        assert (entry["amount"], entry["billable"]) == (301.0, True)
        assert await out(
            client, "add_billing_entry", case_id="C", date="d", description="d", hours="ab", rate=600_000
        ) == (
            "Error executing tool 'add_billing_entry' (MemoryError): "  # a repetition past the bound fails (see README)
        )


async def test_logistics_and_real_estate_tools() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, env_of("logistics"))
        declaration = json.loads(
            await out(client, "submit_customs_declaration", shipment_id="SH-903", hs_code="1", declared_value=2)
        )
        assert re.fullmatch(f"CD-{HEX6}", declaration["declaration_id"]) and declaration["status"] == "submitted"
        assert json.loads(await out(client, "get_delivery_schedule", shipment_id="SH-903")) == {
            "error": "No delivery schedule found for shipment SH-903."
        }
        assert await out(client, "adjust_warehouse_quantity", inventory_id="INV-31", adjustment=-20) == (
            "Inventory INV-31 quantity adjusted by -20."
        )
        assert [i["quantity"] for i in json.loads(await out(client, "list_low_stock_items", threshold=0))] == [-8]
        assert (
            await out(client, "send_carrier_message", to="c@x", subject="s", body="b") == "Carrier message sent to c@x."
        )
        assert json.loads(await out(client, "get_carrier_messages"))[0]["from"] == "t.nowak@freight.example.com"
        await seeded(client, env_of("real_estate"))
        assert [p["property_id"] for p in json.loads(await out(client, "search_properties", min_price=300000))] == [
            "PROP-61"
        ]
        created = await out(client, "create_property", address="1 A St", price=1, bedrooms=1, bathrooms=1)
        assert re.fullmatch(f"Property PROP-{HEX6} created at 1 A St.", created)
        report = await out(
            client, "schedule_inspection", property_id="PROP-62", inspector_name="I", inspection_date="d"
        )
        report_id = report.split()[1]
        assert json.loads(await out(client, "get_inspection_report", report_id=report_id))["findings"] == ""


async def test_reseed_replaces_environment_and_metrics_count_calls() -> None:
    async with serve(fresh_app()) as client:
        await seeded(client, TASKS[1]["environment"])
        await out(client, "send_message", recipient="n@x", subject="s", body="b")
        again = await client.post("/seed_session", json=TASKS[1])  # same cookie
        assert again.status_code == 200
        assert await out(client, "get_messages") == "[]"
        await out(client, "no_such_tool")
        await out(client, "get_schedule")
        metrics = (await client.get("/metrics")).text
        assert 'ipi_tool_calls_total{outcome="ok",tool="send_message"} 1.0' in metrics
        assert 'ipi_tool_calls_total{outcome="unknown_tool",tool="unknown"} 1.0' in metrics
        assert 'ipi_tool_calls_total{outcome="error",tool="get_schedule"} 1.0' in metrics
