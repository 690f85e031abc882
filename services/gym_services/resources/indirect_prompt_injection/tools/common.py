"""Tools and helpers every domain shares: messaging, and adding records to containers.

Environments store collections either as lists or as dicts keyed by ID (``messages``
is a list in the healthcare tasks, the HR ``inbox`` a dict). Helpers here handle both
shapes; IDs come from the session's counter (:meth:`Session.mint_id`), never from
randomness or the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gym_services.resources.indirect_prompt_injection.state import Session

Handler = Callable[..., Any]
DEFAULT_SENDER = "system@example.com"


def ids_in(container: Any, id_field: str) -> set[str]:
    """The IDs a container already uses (dict keys, or ``id_field`` of list items)."""
    if isinstance(container, dict):
        return set(container)
    if isinstance(container, list):
        return {item[id_field] for item in container if isinstance(item, dict) and isinstance(item.get(id_field), str)}
    return set()


def file_record(container: Any, record_id: str, record: dict[str, Any]) -> None:
    """Put ``record`` into a dict container under its ID, or append it to a list container."""
    if isinstance(container, dict):
        container[record_id] = record
    elif isinstance(container, list):
        container.append(record)
    else:
        raise TypeError(f"cannot add a record to a {type(container).__name__}")


def find_record(container: Any, id_field: str, record_id: str) -> dict[str, Any] | None:
    """The record with this ID in a dict (by key) or list (by ``id_field``) container."""
    if isinstance(container, dict):
        record = container.get(record_id)
        return record if isinstance(record, dict) else None
    if isinstance(container, list):
        for item in container:
            if isinstance(item, dict) and item.get(id_field) == record_id:
                return item
    return None


def as_list(container: Any) -> list[Any]:
    """A collection's records in stored order, whatever its shape."""
    if isinstance(container, dict):
        return list(container.values())
    if isinstance(container, list):
        return container
    return []


def sender_of(env: dict[str, Any], explicit: str | None = None) -> str:
    if explicit:
        return explicit
    user = env.get("current_user")
    email = user.get("email") if isinstance(user, dict) else None
    return email if isinstance(email, str) and email else DEFAULT_SENDER


def deliver(session: Session, key: str, message: dict[str, Any]) -> str | None:
    """Store an outgoing message in ``env[key]``; a dict-shaped box files it under a minted ID."""
    env = session.environment
    box = env.setdefault(key, [])
    if isinstance(box, dict):
        message_id = session.mint_id("MSG-", box)
        box[message_id] = {"message_id": message_id, **message}
        return message_id
    if isinstance(box, list):
        box.append(message)
        return None
    raise TypeError(f"cannot deliver a message into a {type(box).__name__}")


def send_message(
    session: Session,
    /,
    recipient: Any = None,
    subject: str = "",
    body: str = "",
    to: Any = None,
    recipients: Any = None,
    from_: str | None = None,
    case_id: str | None = None,
    related_claim_id: str | None = None,
) -> str:
    """Send a message; domains name the addressee ``recipient``, ``to`` or ``recipients``."""
    target = next((value for value in (recipient, to, recipients) if value not in (None, "", [])), None)
    if target is None:
        raise ValueError("send_message needs a recipient")
    message: dict[str, Any] = {
        "from": sender_of(session.environment, from_),
        "to": target,
        "subject": subject,
        "body": body,
        "timestamp": "sent",
    }
    if case_id is not None:
        message["case_id"] = case_id
    if related_claim_id is not None:
        message["related_claim_id"] = related_claim_id
    deliver(session, "messages", message)
    shown = ", ".join(str(t) for t in target) if isinstance(target, list) else target
    return f"Message sent to {shown}."


def get_messages(session: Session, /) -> list[Any]:
    """Messages of the current user, in stored order."""
    return as_list(session.environment.get("messages", []))


TOOLS: dict[str, Handler] = {
    "send_message": send_message,
    "get_messages": get_messages,
}
