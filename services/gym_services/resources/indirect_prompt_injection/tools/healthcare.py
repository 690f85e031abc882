"""Healthcare: patients, charts, appointments, referrals, prescriptions, lab results (plus messaging).

Environment: ``patients`` and ``appointments`` (dicts keyed by ID, required by the tools that read
them), ``prescriptions`` and ``lab_results`` (dicts of lists keyed by patient ID), ``messages``,
``current_user``; ``sent_actions`` appears with the first referral. New appointments get ``A`` and
six hex digits.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, appended_text, lookup, text_contains


def search_patients(env, query) -> list[dict[str, Any]]:
    """ID and name of every patient whose name or one of whose conditions contains ``query``."""
    needle = query.lower()
    hits = []
    for patient in env["patients"].values():
        by_name = text_contains(needle, patient, "name")
        by_condition = any(needle in condition.lower() for condition in patient.get("conditions", []))
        if by_name or by_condition:
            hits.append({"patient_id": patient["patient_id"], "name": patient["name"]})
    return hits


def get_patient_record(env, patient_id) -> Any:
    return lookup(env["patients"], patient_id, {"error": f"Patient {patient_id} not found."})


def update_patient_chart(env, patient_id, notes) -> str:
    """Add ``notes`` to the chart on a new line (or as the chart when it is empty)."""
    patients = env["patients"]
    if patient_id not in patients:
        return f"Error: Patient {patient_id} not found."
    record = patients[patient_id]
    record["chart_notes"] = appended_text(record.get("chart_notes", ""), notes)
    return f"Chart updated for patient {patient_id}."


def get_schedule(env, date) -> list[Any]:
    return [appointment for appointment in env["appointments"].values() if appointment.get("date") == date]


def schedule_appointment(env, patient_id, date, time, reason) -> str:
    appointment_id = new_id("A")
    env["appointments"][appointment_id] = {
        "appointment_id": appointment_id,
        "patient_id": patient_id,
        "date": date,
        "time": time,
        "reason": reason,
        "status": "scheduled",
    }
    return f"Appointment {appointment_id} scheduled for patient {patient_id} on {date} at {time}."


def cancel_appointment(env, appointment_id) -> str:
    """Mark the appointment cancelled; it stays in the schedule."""
    appointments = env["appointments"]
    if appointment_id not in appointments:
        return f"Error: Appointment {appointment_id} not found."
    appointments[appointment_id]["status"] = "cancelled"
    return f"Appointment {appointment_id} has been cancelled."


def send_referral(env, patient_id, specialist_email, reason) -> str:
    if "sent_actions" not in env:
        env["sent_actions"] = []
    referral = {"type": "referral", "patient_id": patient_id, "specialist_email": specialist_email, "reason": reason}
    env["sent_actions"].append(referral)
    return f"Referral sent for patient {patient_id} to {specialist_email}."


def prescribe_medication(env, patient_id, medication, dosage, instructions) -> str:
    if patient_id not in env.get("prescriptions", {}):
        env.setdefault("prescriptions", {})[patient_id] = []
    env["prescriptions"][patient_id].append({"medication": medication, "dosage": dosage, "instructions": instructions})
    return f"Prescribed {medication} {dosage} for patient {patient_id}."


def get_prescriptions(env, patient_id) -> Any:
    return env.get("prescriptions", {}).get(patient_id, [])


def get_lab_results(env, patient_id) -> Any:
    return env.get("lab_results", {}).get(patient_id, [])


#: shared tools (tools/common.py) this domain offers too
SHARED = ("send_message", "get_messages")

TOOLS: dict[str, Handler] = {
    "search_patients": search_patients,
    "get_patient_record": get_patient_record,
    "update_patient_chart": update_patient_chart,
    "get_schedule": get_schedule,
    "schedule_appointment": schedule_appointment,
    "cancel_appointment": cancel_appointment,
    "send_referral": send_referral,
    "prescribe_medication": prescribe_medication,
    "get_prescriptions": get_prescriptions,
    "get_lab_results": get_lab_results,
}
