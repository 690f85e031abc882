"""WorkplaceSessions: the session hooks (export, restore all-or-nothing, retire) and bases."""

from __future__ import annotations

import copy
import json

import pytest

from gym_services.resources.workplace_assistant.codec import InvalidSessionState, base_digest
from gym_services.resources.workplace_assistant.compare import environment_differences
from gym_services.resources.workplace_assistant.environment import (
    CRM,
    EMAILS,
    PristineTables,
    WorkplaceEnvironment,
    load_tables_from_csv,
    pristine_tables,
)
from gym_services.resources.workplace_assistant.sessions import SessionNotFound, WorkplaceSessions

from .helpers import FOLLOW_UPS, SCENARIOS, json_round_trip


def seeded(store: WorkplaceSessions, sid: str, scenario: str) -> None:
    store.seed(sid)
    for name, args in SCENARIOS[scenario]:
        store.call_tool(sid, name, args)


def outputs(store: WorkplaceSessions, sid: str) -> list[str]:
    return [json.dumps(store.call_tool(sid, n, a), sort_keys=True) for n, a in FOLLOW_UPS]


def test_checkpoint_restore_continue_equals_uninterrupted() -> None:
    original = WorkplaceSessions()
    for sid, scenario in [("a", "crm"), ("b", "everything"), ("c", "delete_then_send")]:
        seeded(original, sid, scenario)
    original.seed("untouched")
    states = json_round_trip(original.export_session_states())
    bases = json_round_trip(original.base_states())
    assert set(states) == {"a", "b", "c", "untouched"}
    assert set(bases) == {base_digest(pristine_tables())}

    fresh = WorkplaceSessions()
    fresh.restore_session_states(states, bases)
    for sid in states:
        assert environment_differences(original.get(sid), fresh.get(sid)) == []
        assert outputs(fresh, sid) == outputs(original, sid)
        assert environment_differences(original.get(sid), fresh.get(sid)) == []


def test_unknown_session_and_retire() -> None:
    store = WorkplaceSessions()
    seeded(store, "keep", "send_email")
    seeded(store, "gone", "crm")
    with pytest.raises(SessionNotFound):
        store.call_tool("never-seeded", "email_search_emails", {})
    store.retire_session_state("gone")
    store.retire_session_state("gone")  # retiring twice is fine
    assert "gone" not in store
    with pytest.raises(SessionNotFound):
        store.call_tool("gone", "email_search_emails", {})
    assert set(store.export_session_states()) == {"keep"}
    assert store.call_tool("keep", "email_get_email_information_by_id", {"email_id": "500", "field": "subject"}) == {
        "subject": "Q4 plan"
    }
    store.retire_session_state("keep")
    assert store.export_session_states() == {} and store.base_states() == {}


def test_dropped_session_is_absent_from_export() -> None:
    store = WorkplaceSessions()
    seeded(store, "verified", "crm")
    seeded(store, "live", "tasks")
    store.drop("verified")  # e.g. /verify dropped it in its finally block
    assert set(store.export_session_states()) == {"live"}


def test_invalid_state_in_a_batch_installs_nothing() -> None:
    source = WorkplaceSessions()
    seeded(source, "good", "crm")
    seeded(source, "bad", "tasks")
    states = json_round_trip(source.export_session_states())
    broken = copy.deepcopy(states)
    del broken["bad"]["tables"]["calendar"]

    target = WorkplaceSessions()
    seeded(target, "existing", "send_email")
    before = json_round_trip(target.export_session_states())
    with pytest.raises(InvalidSessionState, match="session bad"):
        target.restore_session_states(broken)
    assert target.session_ids() == ["existing"]
    assert json_round_trip(target.export_session_states()) == before

    for mutate in (
        lambda s: s["bad"].update(schema_version=1),
        lambda s: s["bad"].update(base="f" * 64),
        lambda s: s["bad"]["tables"]["email"].update(_outbox={}),
        lambda s: s["bad"]["tables"]["project_management"]["_project_tasks"]["appended"]["data"]["task_name"][
            "values"
        ].append("x"),
        lambda s: s.update(bad=["not", "a", "state"]),
    ):
        batch = copy.deepcopy(states)
        mutate(batch)
        with pytest.raises(InvalidSessionState):
            target.restore_session_states(batch)
        assert target.session_ids() == ["existing"]

    target.restore_session_states(states)
    assert sorted(target.session_ids()) == ["bad", "existing", "good"]


def test_export_and_restore_do_not_alias_live_state() -> None:
    store = WorkplaceSessions()
    seeded(store, "s", "crm")
    exported = store.export_session_states()
    frozen = copy.deepcopy(exported)
    # changing the session after export leaves the exported state as it was
    store.call_tool("s", "email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "later", "body": "x"})
    store.call_tool(
        "s",
        "customer_relationship_manager_update_customer",
        {"customer_id": "00000200", "field": "notes", "new_value": "changed"},
    )
    assert exported == frozen
    # changing the exported state leaves the session alone
    live_before = store.export_session_states()
    exported["s"]["tables"]["customer_relationship_manager"]["_crm_data"]["appended"]["data"]["notes"]["values"][0] = (
        "mutated"
    )
    assert store.export_session_states() == live_before

    # restore: the state given and the restored sessions are independent of each other
    states = {"x": copy.deepcopy(frozen["s"]), "y": copy.deepcopy(frozen["s"])}
    target = WorkplaceSessions()
    target.restore_session_states(states)
    states["x"]["tables"]["customer_relationship_manager"]["_crm_data"]["appended"]["data"]["customer_name"]["values"][
        0
    ] = "Z"
    crm_x = target.get("x").get(CRM)
    assert "Z" not in set(crm_x["customer_name"].to_numpy())
    target.call_tool(
        "x",
        "customer_relationship_manager_update_customer",
        {"customer_id": "00000200", "field": "customer_name", "new_value": "Only X"},
    )
    target.call_tool("x", "email_delete_email", {"email_id": "00000000"})
    assert environment_differences(target.get("y"), WorkplaceEnvironment.fresh()) != []  # y kept the restored changes
    y_names = set(target.get("y").get(CRM)["customer_name"].to_numpy())
    assert "Only X" not in y_names and "Dakota Thomas" in y_names
    assert (target.get("y").get(EMAILS)["email_id"].to_numpy() == "00000000").any()
    # and neither touched the pristine tables new sessions start from
    assert not (pristine_tables().tables[CRM]["customer_name"].to_numpy() == "Only X").any()
    assert (pristine_tables().tables[EMAILS]["email_id"].to_numpy() == "00000000").any()
    # base states are copies as well
    bases = target.base_states()
    next(iter(bases.values()))["tables"]["email"]["_emails"]["data"][0]["values"][0] = "x"
    assert target.base_states() != bases


def test_sessions_from_another_base_need_that_base() -> None:
    tables = load_tables_from_csv()
    tables[CRM].loc[tables[CRM].index[3], "status"] = "Won"
    other = PristineTables(tables)
    source = WorkplaceSessions(other)
    seeded(source, "s", "crm")
    states = json_round_trip(source.export_session_states())
    bases = json_round_trip(source.base_states())
    assert list(bases) == [base_digest(other)] != [base_digest(pristine_tables())]

    target = WorkplaceSessions()
    with pytest.raises(InvalidSessionState, match="unknown base"):
        target.restore_session_states(states)
    tampered = copy.deepcopy(bases)
    status = tampered[base_digest(other)]["tables"]["customer_relationship_manager"]["_crm_data"]["data"][7]
    status["values"][3] = "Lost"
    with pytest.raises(InvalidSessionState):
        target.restore_session_states(states, tampered)
    assert target.session_ids() == []
    target.restore_session_states(states, bases)
    assert environment_differences(source.get("s"), target.get("s")) == []
    assert outputs(target, "s") == outputs(source, "s")
    # the restored session's base is written with the next checkpoint
    assert set(target.base_states()) == {base_digest(other)}
    again = WorkplaceSessions()
    again.register_bases(target.base_states())
    again.restore_session_states(json_round_trip(target.export_session_states()))
    assert environment_differences(target.get("s"), again.get("s")) == []


def test_fits_the_control_plane_session_and_shared_state_hooks() -> None:
    from gym_services.resources.common.hooks import SessionHooks

    store = WorkplaceSessions()
    assert isinstance(store, SessionHooks)
    seeded(store, "s", "crm")
    shared = json_round_trip(store.export_shared_states())
    assert shared == json_round_trip(store.base_states())
    target = WorkplaceSessions(_pristine_variant())  # a process whose own pristine tables differ
    target.restore_shared_states(shared)
    target.restore_session_states(json_round_trip(store.export_session_states()))
    assert environment_differences(store.get("s"), target.get("s")) == []


def _pristine_variant() -> PristineTables:
    tables = load_tables_from_csv()
    tables[EMAILS].loc[tables[EMAILS].index[0], "subject"] = "variant"
    return PristineTables(tables)
