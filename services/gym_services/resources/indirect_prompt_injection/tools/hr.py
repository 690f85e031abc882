"""HR / recruiting tools: candidates, interviews, feedback, offers, email, job postings.

Environment keys: ``candidates`` and ``open_positions`` (dicts keyed by ID),
``interviews`` (dict, may be absent), ``inbox`` (dict keyed by message ID) or
``messages`` (list) for mail, ``current_user``; ``sent_actions`` appears once an offer
is sent. Interview, posting and dict-mailbox IDs come from the session's counter.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import Session
from gym_services.resources.indirect_prompt_injection.tools.common import (
    Handler,
    as_list,
    deliver,
    file_record,
    ids_in,
    sender_of,
)


def _candidates(session: Session) -> dict[str, Any]:
    candidates = session.environment.get("candidates", {})
    return candidates if isinstance(candidates, dict) else {}


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key, "")
    return value.lower() if isinstance(value, str) else ""


def search_candidates(session: Session, /, query: str, status: str | None = None) -> list[dict[str, Any]]:
    """Candidates whose name, resume, notes or position contain ``query``, optionally of one status."""
    needle = query.lower()
    hits = []
    for candidate in _candidates(session).values():
        fields = ("name", "resume", "application_notes", "position_applied")
        if not any(needle in _text(candidate, f) for f in fields):
            continue
        if status is not None and _text(candidate, "status") != status.lower():
            continue
        hits.append({"candidate_id": candidate.get("candidate_id"), "name": candidate.get("name")})
    return hits


def get_candidate_profile(session: Session, /, candidate_id: str) -> dict[str, Any]:
    candidates = _candidates(session)
    if candidate_id not in candidates:
        return {"error": f"Candidate {candidate_id} not found."}
    return candidates[candidate_id]


def update_candidate_status(session: Session, /, candidate_id: str, status: str) -> str:
    candidates = _candidates(session)
    if candidate_id not in candidates:
        return f"Error: Candidate {candidate_id} not found."
    candidates[candidate_id]["status"] = status
    return f"Status updated for candidate {candidate_id} to '{status}'."


def _new_interview(session: Session, record: dict[str, Any]) -> str:
    interviews = session.environment.setdefault("interviews", {})
    interview_id = session.mint_id("I-", ids_in(interviews, "interview_id"))
    file_record(interviews, interview_id, {"interview_id": interview_id, **record})
    return interview_id


def schedule_interview(session: Session, /, candidate_id: str, interviewer_email: str, date: str, time: str) -> str:
    interview_id = _new_interview(
        session,
        {
            "candidate_id": candidate_id,
            "interviewer_email": interviewer_email,
            "date": date,
            "time": time,
            "status": "scheduled",
        },
    )
    return f"Interview {interview_id} scheduled for candidate {candidate_id} on {date} at {time}."


def get_interview_schedule(session: Session, /, date: str | None = None) -> list[dict[str, Any]]:
    interviews = as_list(session.environment.get("interviews", {}))
    return [i for i in interviews if isinstance(i, dict) and (date is None or i.get("date") == date)]


def submit_interview_feedback(session: Session, /, candidate_id: str, feedback: str, rating: Any) -> str:
    """Attach feedback to the candidate's first interview, or record it as a new one."""
    interviews = session.environment.get("interviews", {})
    existing = next(
        (i for i in as_list(interviews) if isinstance(i, dict) and i.get("candidate_id") == candidate_id), None
    )
    if existing is not None:
        existing["feedback"] = feedback
        existing["rating"] = rating
    else:
        _new_interview(session, {"candidate_id": candidate_id, "feedback": feedback, "rating": rating})
    return f"Feedback submitted for candidate {candidate_id}."


def send_offer(session: Session, /, candidate_id: str, position: str, salary: str, start_date: str) -> str:
    session.environment.setdefault("sent_actions", []).append(
        {
            "type": "offer",
            "candidate_id": candidate_id,
            "position": position,
            "salary": salary,
            "start_date": start_date,
        }
    )
    return f"Offer sent to candidate {candidate_id} for position '{position}'."


def _mailbox_key(session: Session) -> str:
    return "inbox" if "inbox" in session.environment else "messages"


def send_email(session: Session, /, recipient: str, subject: str, body: str) -> str:
    """Sent mail goes to the mailbox the environment has (``inbox``, else ``messages``)."""
    message = {
        "from": sender_of(session.environment),
        "to": recipient,
        "subject": subject,
        "body": body,
        "timestamp": "sent",
    }
    deliver(session, _mailbox_key(session), message)
    return f"Email sent to {recipient}."


def get_inbox(session: Session, /) -> list[Any]:
    return as_list(session.environment.get(_mailbox_key(session), []))


def get_open_positions(session: Session, /) -> list[Any]:
    return as_list(session.environment.get("open_positions", {}))


def create_job_posting(session: Session, /, title: str, description: str, requirements: str) -> str:
    positions = session.environment.setdefault("open_positions", {})
    position_id = session.mint_id("POS-", ids_in(positions, "position_id"))
    file_record(
        positions,
        position_id,
        {
            "position_id": position_id,
            "title": title,
            "description": description,
            "requirements": requirements,
            "status": "open",
        },
    )
    return f"Job posting '{title}' created with ID {position_id}."


TOOLS: dict[str, Handler] = {
    "search_candidates": search_candidates,
    "get_candidate_profile": get_candidate_profile,
    "update_candidate_status": update_candidate_status,
    "schedule_interview": schedule_interview,
    "get_interview_schedule": get_interview_schedule,
    "submit_interview_feedback": submit_interview_feedback,
    "send_offer": send_offer,
    "send_email": send_email,
    "get_inbox": get_inbox,
    "get_open_positions": get_open_positions,
    "create_job_posting": create_job_posting,
}
