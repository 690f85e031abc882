"""Healthcare tools: patients, charts, appointments, referrals, prescriptions, lab results.

Environment keys: ``patients`` and ``appointments`` (dicts keyed by ID), ``messages``
(list or dict), ``prescriptions`` and ``lab_results`` (dicts of lists keyed by patient
ID), ``current_user``; ``sent_actions`` appears once a referral is sent. Handlers change
the environment in place and return either text or JSON-able values read from it.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import Session
from gym_services.resources.indirect_prompt_injection.tools.common import (
    Handler,
    as_list,
    file_record,
    find_record,
    ids_in,
)


def _patients(session: Session) -> dict[str, Any]:
    patients = session.environment.get("patients", {})
    return patients if isinstance(patients, dict) else {}


def search_patients(session: Session, /, query: str) -> list[dict[str, Any]]:
    """Patients whose name or any condition contains ``query`` (case-insensitive)."""
    needle = query.lower()
    hits = []
    for patient in _patients(session).values():
        name = str(patient.get("name", ""))
        conditions = patient.get("conditions", []) or []
        if needle in name.lower() or any(needle in str(c).lower() for c in conditions):
            hits.append({"patient_id": patient.get("patient_id"), "name": patient.get("name")})
    return hits


def get_patient_record(session: Session, /, patient_id: str) -> dict[str, Any]:
    patients = _patients(session)
    if patient_id not in patients:
        return {"error": f"Patient {patient_id} not found."}
    return patients[patient_id]


def update_patient_chart(session: Session, /, patient_id: str, notes: str) -> str:
    """Append ``notes`` to the chart on a new line."""
    patients = _patients(session)
    if patient_id not in patients:
        return f"Error: Patient {patient_id} not found."
    record = patients[patient_id]
    existing = record.get("chart_notes", "")
    record["chart_notes"] = f"{existing}\n{notes}" if existing else notes
    return f"Chart updated for patient {patient_id}."


def get_schedule(session: Session, /, date: str) -> list[dict[str, Any]]:
    appointments = as_list(session.environment.get("appointments", {}))
    return [a for a in appointments if isinstance(a, dict) and a.get("date") == date]


def schedule_appointment(session: Session, /, patient_id: str, date: str, time: str, reason: str) -> str:
    appointments = session.environment.setdefault("appointments", {})
    appointment_id = session.mint_id("APT-", ids_in(appointments, "appointment_id"))
    file_record(
        appointments,
        appointment_id,
        {
            "appointment_id": appointment_id,
            "patient_id": patient_id,
            "date": date,
            "time": time,
            "reason": reason,
            "status": "scheduled",
        },
    )
    return f"Appointment {appointment_id} scheduled for patient {patient_id} on {date} at {time}."


def cancel_appointment(session: Session, /, appointment_id: str) -> str:
    """Mark the appointment cancelled; it stays in the schedule."""
    appointment = find_record(session.environment.get("appointments", {}), "appointment_id", appointment_id)
    if appointment is None:
        return f"Error: Appointment {appointment_id} not found."
    appointment["status"] = "cancelled"
    return f"Appointment {appointment_id} has been cancelled."


def send_referral(session: Session, /, patient_id: str, specialist_email: str, reason: str) -> str:
    session.environment.setdefault("sent_actions", []).append(
        {"type": "referral", "patient_id": patient_id, "specialist_email": specialist_email, "reason": reason}
    )
    return f"Referral sent for patient {patient_id} to {specialist_email}."


def prescribe_medication(session: Session, /, patient_id: str, medication: str, dosage: str, instructions: str) -> str:
    prescriptions = session.environment.setdefault("prescriptions", {})
    prescriptions.setdefault(patient_id, []).append(
        {"medication": medication, "dosage": dosage, "instructions": instructions}
    )
    return f"Prescribed {medication} {dosage} for patient {patient_id}."


def get_prescriptions(session: Session, /, patient_id: str) -> list[Any]:
    return session.environment.get("prescriptions", {}).get(patient_id, [])


def get_lab_results(session: Session, /, patient_id: str) -> list[Any]:
    return session.environment.get("lab_results", {}).get(patient_id, [])


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
