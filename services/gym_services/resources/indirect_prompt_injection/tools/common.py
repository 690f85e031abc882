"""The messaging tools several domains share, and what every domain module uses.

Handlers follow one convention, the reference server's: ``handler(env, **arguments)``, where ``env``
is the session's environment (a dict changed in place) and the arguments are the model's call
arguments minus those that are ``null``. A handler returns text or a JSON-able value read from the
environment. It raises on inputs it cannot handle; the caller turns the exception into the text
the model sees (``Error executing tool '<name>' (<Type>): <message>``), so a handler's name, its
parameter names and order, and the order in which it touches the environment are all part of what
the model sees and are kept as NeMo Gym's are.

``send_message`` and ``get_messages`` serve every domain's environment shape: the addressee is
``recipient``, ``to`` or ``recipients`` (a list is joined), the mailbox ``messages`` a list or a dict
keyed by message ID; ``get_messages`` filters by case, sender, addressee and read flag when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id

Handler = Callable[..., Any]
FALLBACK_SENDER = "system@example.com"


def _addressee(kwargs: dict[str, Any]) -> str:
    """The first truthy of ``recipient``, ``to``, ``recipients``, as text (``unknown`` if none)."""
    value = kwargs.get("recipient") or kwargs.get("to") or kwargs.get("recipients")
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value) if value else "unknown"


def send_message(env, **kwargs) -> str:
    """File an outgoing message in ``env["messages"]`` (appended to a list, keyed by a new ID in a dict)."""
    user = env.get("current_user", {})
    sender = kwargs.get("from_") or user.get("email") or user.get("name", FALLBACK_SENDER)
    shown = _addressee(kwargs)
    message: dict[str, Any] = {
        "from": sender,
        "to": shown,
        "subject": kwargs.get("subject", ""),
        "body": kwargs.get("body", ""),
        "timestamp": "sent",
    }
    for optional in ("case_id", "related_claim_id"):
        if optional in kwargs:
            message[optional] = kwargs[optional]
    box = env.get("messages")
    if isinstance(box, dict):
        message_id = new_id("MSG-")
        message["message_id"] = message_id
        box[message_id] = message
    elif isinstance(box, list):
        box.append(message)
    else:
        env.setdefault("messages", []).append(message)
    return f"Message sent to {shown}."


def _matching(records: list[Any], field: str, wanted: Any) -> list[Any]:
    """Records whose ``field`` equals ``wanted`` ignoring case (both must be text)."""
    return [r for r in records if r.get(field, "").lower() == wanted.lower()]


def get_messages(env, **kwargs) -> list[Any]:
    """The mailbox in stored order, optionally narrowed by ``case_id``, ``from_``, ``to``, ``is_read``."""
    box = env.get("messages", [])
    found = list(box.values()) if isinstance(box, dict) else list(box)
    if kwargs.get("case_id"):
        found = [m for m in found if m.get("case_id") == kwargs["case_id"]]
    if kwargs.get("from_"):
        found = _matching(found, "from", kwargs["from_"])
    if kwargs.get("to"):
        found = _matching(found, "to", kwargs["to"])
    if kwargs.get("is_read") is not None:
        found = [m for m in found if m.get("is_read") == kwargs["is_read"]]
    return found


# --- helpers the domain modules share ------------------------------------------------------------


def lookup(container: Any, key: Any, missing: Any) -> Any:
    """``container[key]``, or ``missing`` when the key is absent (``in`` first, as the tools check)."""
    if key not in container:
        return missing
    return container[key]


def appended_text(existing: Any, addition: Any) -> Any:
    """Notes that grow: ``existing + "\\n" + addition`` when there is something, else ``addition``."""
    return existing + "\n" + addition if existing else addition


def text_contains(needle: str, record: Any, field: str) -> bool:
    """``needle`` (already lower case) occurs in the record's field, ignoring case."""
    return needle in record.get(field, "").lower()


def same_text(record: Any, field: str, wanted: Any) -> bool:
    """The record's field equals ``wanted`` ignoring case (the record's side is read first)."""
    return record.get(field, "").lower() == wanted.lower()


TOOLS: dict[str, Handler] = {
    "send_message": send_message,
    "get_messages": get_messages,
}
