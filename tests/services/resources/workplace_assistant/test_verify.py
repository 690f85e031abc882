"""Verify: replay both action lists on fresh environments and compare the five tables."""

from __future__ import annotations

import json

import pytest

from gym_services.resources.workplace_assistant.environment import CRM, WorkplaceEnvironment
from gym_services.resources.workplace_assistant.tools import call_tool
from gym_services.resources.workplace_assistant.verify import (
    extract_function_calls,
    is_correct,
    replay,
    verify_reward,
)

from .conftest import load_examples

EXAMPLES = load_examples()


def as_output(actions: list[dict]) -> list[dict]:
    """A Responses API output list holding the actions as function calls, plus other items."""
    items: list[dict] = [{"type": "reasoning", "summary": []}]
    for n, action in enumerate(actions):
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": action["name"], "arguments": action["arguments"]}
        )
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": "{}"})
    items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]})
    return items


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["category"] + "-" + str(e["id"]) for e in EXAMPLES])
def test_ground_truth_replay_is_correct(example: dict) -> None:
    truth = example["ground_truth"]
    assert is_correct(truth, truth)
    assert verify_reward(as_output(truth), truth) == 1.0
    # NeMo Gym's verifier iterates a ground truth given as text: its characters are no actions
    assert is_correct([], json.dumps(truth)) and not is_correct(truth, json.dumps(truth))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["category"] + "-" + str(e["id"]) for e in EXAMPLES])
def test_wrong_actions_are_not_correct(example: dict) -> None:
    truth = example["ground_truth"]
    assert not is_correct([], truth)  # doing nothing
    assert not is_correct(truth[:-1], truth)  # stopping one call short
    wrong_target = [
        {"name": "customer_relationship_manager_delete_customer", "arguments": json.dumps({"customer_id": "00000001"})}
    ]
    assert not is_correct(truth + wrong_target, truth)  # an extra destructive call
    assert verify_reward(as_output(truth[:-1]), truth) == 0.0


def test_reads_and_failed_calls_do_not_matter() -> None:
    truth = EXAMPLES[0]["ground_truth"]
    noisy = [
        {"name": "email_search_emails", "arguments": json.dumps({"query": "carlos prototype"})},
        {"name": "email_delete_email", "arguments": json.dumps({"email_id": "no-such-id"})},
        {"name": "not_a_tool", "arguments": "{}"},
        {"name": "email_reply_email", "arguments": "{broken json"},
        *truth,
    ]
    assert is_correct(noisy, truth)


def test_string_columns_compare_case_insensitively_except_enums() -> None:
    truth = EXAMPLES[1]["ground_truth"]  # rename event 00000252 to "Risk Management Forum"
    lower = [
        {"name": a["name"], "arguments": a["arguments"].replace("Risk Management Forum", "risk management FORUM")}
        for a in truth
    ]
    assert is_correct(lower, truth)
    status_truth = [
        {
            "name": "project_management_update_task",
            "arguments": json.dumps({"task_id": "00000149", "field": "list_name", "new_value": "Completed"}),
        }
    ]
    other_list = [
        {
            "name": "project_management_update_task",
            "arguments": json.dumps({"task_id": "00000149", "field": "list_name", "new_value": "In Review"}),
        }
    ]
    assert not is_correct(other_list, status_truth)


def test_order_of_appends_matters_like_the_index_does() -> None:
    a = {
        "name": "email_send_email",
        "arguments": json.dumps({"recipient": "raj.patel@atlas.com", "subject": "a", "body": "x"}),
    }
    b = {
        "name": "email_send_email",
        "arguments": json.dumps({"recipient": "raj.patel@atlas.com", "subject": "b", "body": "y"}),
    }
    assert is_correct([a, b], [a, b])
    assert not is_correct([b, a], [a, b])  # the IDs and labels go to different emails


def test_verify_ignores_the_live_session() -> None:
    live = WorkplaceEnvironment.fresh()
    call_tool(live, "customer_relationship_manager_delete_customer", {"customer_id": "00000095"})
    truth = EXAMPLES[2]["ground_truth"]
    assert verify_reward(as_output(truth), truth) == 1.0
    assert replay(truth).get(CRM)["customer_id"].isin(["00000095"]).any()


def test_extract_function_calls_from_dicts_and_objects() -> None:
    class Item:
        def __init__(self, **kw: object) -> None:
            self.__dict__.update(kw)

    output = [
        {"type": "message", "content": []},
        {"type": "function_call", "name": "email_delete_email", "arguments": '{"email_id": "1"}', "call_id": "x"},
        Item(type="function_call", name="calendar_delete_event", arguments='{"event_id": "2"}'),
        Item(type="function_call_output", output="..."),
    ]
    assert extract_function_calls(output) == [
        {"type": "function_call", "name": "email_delete_email", "arguments": '{"email_id": "1"}', "call_id": "x"},
        {"name": "calendar_delete_event", "arguments": '{"event_id": "2"}'},
    ]


def test_replayed_arguments_keep_nulls_unlike_the_route() -> None:
    """The verifier passes ``null`` arguments on (the route drops them): notes None is not notes ""."""
    add = {"customer_name": "N", "assigned_to_email": "a@atlas.com", "status": "Lead"}
    with_null = [
        {"name": "customer_relationship_manager_add_customer", "arguments": json.dumps({**add, "notes": None})}
    ]
    without = [{"name": "customer_relationship_manager_add_customer", "arguments": json.dumps(add)}]
    assert not is_correct(with_null, without)
    assert replay(with_null).get(CRM)["notes"].iloc[-1] is None
