"""Email toolkit: read, search, send, delete, forward and reply over the session's ``_emails``."""

from __future__ import annotations

import numpy as np

from ..environment import CURRENT_TIME, EMAILS, WorkplaceEnvironment
from ._common import (
    ToolError,
    append_row,
    delete_by_id,
    field_by_id,
    match_mask,
    next_id,
    next_label,
    paginate,
    parse_date,
    records,
)

EMAIL_FIELDS = ("email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body")


def _valid_address(address: str) -> bool:
    return "@" in address and "." in address


def email_get_email_information_by_id(
    env: WorkplaceEnvironment, email_id: str | None = None, field: str | None = None
) -> object:
    return field_by_id(env.get(EMAILS), "email_id", email_id, field, EMAIL_FIELDS, "Email")


def email_search_emails(
    env: WorkplaceEnvironment,
    query: str = "",
    date_min: str | None = None,
    date_max: str | None = None,
    page: int = 1,
    page_size: int = 5,
) -> object:
    """Emails whose subject, body or sender/recipient together contain every query word, newest
    first (ties keep table order)."""
    emails = env.get(EMAILS)
    words = query.lower().split()
    lo = parse_date(date_min, "date_min") if date_min else None
    hi = parse_date(date_max, "date_max") if date_max else None
    keep = []
    for subject, body, who, sent in zip(
        emails["subject"].to_numpy(),
        emails["body"].to_numpy(),
        emails["sender/recipient"].to_numpy(),
        emails["sent_datetime"].to_numpy(),
        strict=True,
    ):
        text = " ".join(str(v) for v in (subject, body, who) if isinstance(v, str)).lower()
        day = sent[:10] if isinstance(sent, str) else None
        ok = all(w in text for w in words)
        if ok and (lo or hi):
            ok = day is not None and (lo is None or day >= lo) and (hi is None or day <= hi)
        keep.append(ok)
    found = emails[np.array(keep, dtype=bool)]
    if found.empty:
        return "No emails found."
    found = found.sort_values("sent_datetime", ascending=False, kind="stable")
    return paginate(records(found), page, page_size, "emails")


def _send(env: WorkplaceEnvironment, recipient: str, subject: str, body: str) -> None:
    emails = env.get(EMAILS)
    row = {
        "email_id": next_id(emails, "email_id"),
        "inbox/outbox": "outbox",
        "sender/recipient": recipient.lower(),
        "subject": subject,
        "sent_datetime": CURRENT_TIME,
        "body": body,
    }
    env.put(EMAILS, append_row(emails, next_label(emails), row))


def email_send_email(
    env: WorkplaceEnvironment,
    recipient: str | None = None,
    subject: str | None = None,
    body: str | None = None,
) -> object:
    if not recipient or not subject or not body:
        return "Recipient, subject, or body not provided."
    if not _valid_address(recipient):
        return "Invalid recipient email address."
    _send(env, recipient, subject, body)
    return "Email sent successfully."


def email_delete_email(env: WorkplaceEnvironment, email_id: str | None = None) -> object:
    return delete_by_id(env, EMAILS, "email_id", email_id, "Email")


def _original(env: WorkplaceEnvironment, email_id: str) -> dict[str, object] | None:
    emails = env.get(EMAILS)
    rows = emails[match_mask(emails, "email_id", email_id)]
    return None if rows.empty else records(rows.iloc[:1])[0]


def email_forward_email(
    env: WorkplaceEnvironment, email_id: str | None = None, recipient: str | None = None
) -> object:
    if not email_id or not recipient:
        return "Email ID or recipient not provided."
    original = _original(env, email_id)
    if original is None:
        return "Email not found."
    if not _valid_address(recipient):
        return "Invalid recipient email address."
    subject, body = original["subject"], original["body"]
    if not isinstance(subject, str) or not isinstance(body, str):
        raise ToolError("the original email has no subject or body to forward")
    _send(env, recipient, f"FW: {subject}", body)
    return "Email forwarded successfully."


def email_reply_email(
    env: WorkplaceEnvironment, email_id: str | None = None, body: str | None = None
) -> object:
    if not email_id or not body:
        return "Email ID or body not provided."
    original = _original(env, email_id)
    if original is None:
        return "Email not found."
    to, subject = original["sender/recipient"], original["subject"]
    if not isinstance(to, str) or not _valid_address(to) or not isinstance(subject, str):
        raise ToolError("the original email has no valid address or subject to reply to")
    _send(env, to, subject, body)
    return "Email replied successfully."


TOOLS = {
    "email_get_email_information_by_id": email_get_email_information_by_id,
    "email_search_emails": email_search_emails,
    "email_send_email": email_send_email,
    "email_delete_email": email_delete_email,
    "email_forward_email": email_forward_email,
    "email_reply_email": email_reply_email,
}
