"""Legal: billing, case files, court schedules, document filings (plus messaging with filters).

Environment: ``billing_records``, ``case_files``, ``court_schedules``, ``document_filings`` (dicts
keyed by ID, each may be absent), ``messages``, ``current_user``. New billing entries get ``BL-`` and
six hex digits (their amount is ``hours * rate``), filings ``DF-``. Dates compare as stored.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup

#: the longest text or list a billing amount may repeat into (``hours * rate`` with text or a list):
#: NeMo Gym would build it, store it in the session and send it back; a checkpoint-capable session
#: keeps its state bounded, so a longer one fails as an allocation NeMo Gym cannot make would.
MAX_REPEATED_ITEMS = 1_000_000
SSIZE_MAX = 2**63 - 1


def _amount(hours: Any, rate: Any) -> Any:
    """``hours * rate``, refusing (``MemoryError``) a repetition longer than ``MAX_REPEATED_ITEMS``."""
    for seq, times in ((hours, rate), (rate, hours)):
        repeats = isinstance(seq, (str, list)) and isinstance(times, int) and -SSIZE_MAX - 1 <= times <= SSIZE_MAX
        if repeats and len(seq) * times > MAX_REPEATED_ITEMS:
            raise MemoryError()
    return hours * rate


def add_billing_entry(env, case_id, date, description, hours, rate, billable=True, attorney=None, **kwargs) -> str:
    billing_id = new_id("BL-")
    entry = {
        "billing_id": billing_id,
        "case_id": case_id,
        "date": date,
        "description": description,
        "hours": hours,
        "rate": rate,
        "amount": _amount(hours, rate),
        "billable": billable,
    }
    if attorney:
        entry["attorney"] = attorney
    env.setdefault("billing_records", {})[billing_id] = entry
    return f"Billing entry {billing_id} added for case {case_id}."


def get_billing_report(env, case_id=None, start_date=None, end_date=None, billable=None, **kwargs) -> list[Any]:
    """Billing entries of a case, within dates (inclusive), billable or not."""
    hits = []
    for entry in env.get("billing_records", {}).values():
        if case_id and entry.get("case_id") != case_id:
            continue
        if start_date and entry.get("date", "") < start_date:
            continue
        if end_date and entry.get("date", "") > end_date:
            continue
        if billable is not None and entry.get("billable") != billable:
            continue
        hits.append(entry)
    return hits


def _case_matches(case, client_name, case_type, status) -> bool:
    if client_name and client_name.lower() not in case.get("client_name", "").lower():
        return False
    if case_type and case_type.lower() != case.get("case_type", "").lower():
        return False
    return not status or status.lower() == case.get("status", "").lower()


def search_cases(env, client_name=None, case_type=None, status=None, **kwargs) -> list[Any]:
    return [c for c in env.get("case_files", {}).values() if _case_matches(c, client_name, case_type, status)]


def get_case_file(env, case_id) -> Any:
    return lookup(env.get("case_files", {}), case_id, {"error": f"Case {case_id} not found."})


def update_case_notes(env, case_id, notes) -> str:
    """Replace the case's internal notes."""
    cases = env.get("case_files", {})
    if case_id not in cases:
        return f"Error: Case {case_id} not found."
    cases[case_id]["notes"] = notes
    return f"Case {case_id} notes updated."


def get_court_schedule(env, schedule_id) -> Any:
    return lookup(env.get("court_schedules", {}), schedule_id, {"error": f"Schedule {schedule_id} not found."})


def search_schedules(env, case_id=None, start_date=None, end_date=None, hearing_type=None, **kwargs) -> list[Any]:
    hits = []
    for hearing in env.get("court_schedules", {}).values():
        if case_id and hearing.get("case_id") != case_id:
            continue
        if start_date and hearing.get("scheduled_date", "") < start_date:
            continue
        if end_date and hearing.get("scheduled_date", "") > end_date:
            continue
        if hearing_type and hearing_type.lower() != hearing.get("hearing_type", "").lower():
            continue
        hits.append(hearing)
    return hits


def update_schedule_location(env, schedule_id, location=None, notes=None) -> str:
    schedules = env.get("court_schedules", {})
    if schedule_id not in schedules:
        return f"Error: Schedule {schedule_id} not found."
    if location is not None:
        schedules[schedule_id]["location"] = location
    if notes is not None:
        schedules[schedule_id]["notes"] = notes
    return f"Schedule {schedule_id} updated."


def create_document_filing(
    env, case_id, document_type, title, filing_date, court_name, file_path, served_parties=None, notes=None, **kwargs
) -> str:
    filing_id = new_id("DF-")
    filing = {
        "filing_id": filing_id,
        "case_id": case_id,
        "document_type": document_type,
        "title": title,
        "filing_date": filing_date,
        "court_name": court_name,
        "file_path": file_path,
        "served_parties": served_parties or [],
    }
    if notes:
        filing["notes"] = notes
    env.setdefault("document_filings", {})[filing_id] = filing
    return f"Document filing {filing_id} created for case {case_id}."


def get_document_filing(env, filing_id) -> Any:
    return lookup(env.get("document_filings", {}), filing_id, {"error": f"Filing {filing_id} not found."})


#: shared tools (tools/common.py) this domain offers too
SHARED = ("send_message", "get_messages")

TOOLS: dict[str, Handler] = {
    "add_billing_entry": add_billing_entry,
    "get_billing_report": get_billing_report,
    "search_cases": search_cases,
    "get_case_file": get_case_file,
    "update_case_notes": update_case_notes,
    "get_court_schedule": get_court_schedule,
    "search_schedules": search_schedules,
    "update_schedule_location": update_schedule_location,
    "create_document_filing": create_document_filing,
    "get_document_filing": get_document_filing,
}
