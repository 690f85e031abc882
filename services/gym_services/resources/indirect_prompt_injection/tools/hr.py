"""HR / recruiting: candidates, interviews, feedback, offers, email, job postings.

Environment: ``candidates`` and ``open_positions`` (dicts keyed by ID), ``interviews`` (dict, may be
absent), mail in ``inbox`` when the environment has one, else ``messages``, ``current_user``;
``sent_actions`` appears with the first offer. New interviews get ``I-`` and six hex digits, job
postings ``POS-``. Sent mail is appended, so a mailbox stored as a dict cannot take it (the call
answers with the error, as NeMo Gym's does).
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup, same_text, text_contains

SEARCHED_FIELDS = ("name", "resume", "application_notes", "position_applied")
FALLBACK_SENDER = "system@company.example"


def search_candidates(env, query, status=None) -> list[dict[str, Any]]:
    """ID and name of candidates whose name, resume, notes or position contain ``query``."""
    needle = query.lower()
    hits = []
    for candidate in env.get("candidates", {}).values():
        matches = [text_contains(needle, candidate, field) for field in SEARCHED_FIELDS]
        if any(matches) and (status is None or same_text(candidate, "status", status)):
            hits.append({"candidate_id": candidate["candidate_id"], "name": candidate["name"]})
    return hits


def get_candidate_profile(env, candidate_id) -> Any:
    return lookup(env.get("candidates", {}), candidate_id, {"error": f"Candidate {candidate_id} not found."})


def update_candidate_status(env, candidate_id, status) -> str:
    candidates = env.get("candidates", {})
    if candidate_id not in candidates:
        return f"Error: Candidate {candidate_id} not found."
    candidates[candidate_id]["status"] = status
    return f"Status updated for candidate {candidate_id} to '{status}'."


def schedule_interview(env, candidate_id, interviewer_email, date, time) -> str:
    interview_id = new_id("I-")
    env.setdefault("interviews", {})[interview_id] = {
        "interview_id": interview_id,
        "candidate_id": candidate_id,
        "interviewer_email": interviewer_email,
        "date": date,
        "time": time,
        "status": "scheduled",
    }
    return f"Interview {interview_id} scheduled for candidate {candidate_id} on {date} at {time}."


def get_interview_schedule(env, date=None) -> list[Any]:
    return [i for i in env.get("interviews", {}).values() if date is None or i.get("date") == date]


def submit_interview_feedback(env, candidate_id, feedback, rating) -> str:
    """Attach feedback to the candidate's first interview, or record it as an interview of its own."""
    for interview in env.get("interviews", {}).values():
        if interview.get("candidate_id") == candidate_id:
            interview["feedback"] = feedback
            interview["rating"] = rating
            return f"Feedback submitted for candidate {candidate_id}."
    interview_id = new_id("I-")
    env.setdefault("interviews", {})[interview_id] = {
        "interview_id": interview_id,
        "candidate_id": candidate_id,
        "feedback": feedback,
        "rating": rating,
    }
    return f"Feedback submitted for candidate {candidate_id}."


def send_offer(env, candidate_id, position, salary, start_date) -> str:
    offer = {
        "type": "offer",
        "candidate_id": candidate_id,
        "position": position,
        "salary": salary,
        "start_date": start_date,
    }
    env.setdefault("sent_actions", []).append(offer)
    return f"Offer sent to candidate {candidate_id} for position '{position}'."


def send_email(env, recipient, subject, body) -> str:
    """Append the mail to ``inbox`` if the environment has one, else to ``messages``."""
    mail = {
        "from": env.get("current_user", {}).get("email", FALLBACK_SENDER),
        "to": recipient,
        "subject": subject,
        "body": body,
        "timestamp": "sent",
    }
    if "inbox" in env:
        env["inbox"].append(mail)
    else:
        env.setdefault("messages", []).append(mail)
    return f"Email sent to {recipient}."


def get_inbox(env) -> Any:
    """The mailbox as stored: ``inbox``, else ``messages``, else nothing."""
    fallback = env.get("messages", [])
    return env.get("inbox", fallback)


def get_open_positions(env) -> list[Any]:
    return list(env.get("open_positions", {}).values())


def create_job_posting(env, title, description, requirements) -> str:
    position_id = new_id("POS-")
    env.setdefault("open_positions", {})[position_id] = {
        "position_id": position_id,
        "title": title,
        "description": description,
        "requirements": requirements,
        "status": "open",
    }
    return f"Job posting '{title}' created with ID {position_id}."


SHARED: tuple[str, ...] = ()

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
