"""The restore decision: one object per restore transaction, settled by a conditional put.

A restore is all-or-nothing only if every participant ends the same way. The coordinator
resumes them one role at a time; if it dies halfway, the resumed ones keep the restored state
while the others' leases run out. So the outcome is written down before anyone resumes:
the coordinator puts ``resume`` once all participants report ``restored``, and a participant
whose lease runs out first puts ``abort``. ``put_if_absent`` lets exactly one of them win;
everyone else reads the winner and follows it. These functions block (storage I/O): call them
in a thread.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from gym_services.control import layout
from gym_services.control.models import SCHEMA_VERSION, RestoreDecision
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import Decision
from gym_services.control.storage import AlreadyExists, NotFound, Storage


def read_decision(storage: Storage, checkpoint_id: str, restore_id: str) -> Decision | None:
    """The settled outcome, or None while nobody has decided."""
    try:
        data = storage.get(layout.restore_decision_key(checkpoint_id, restore_id))
    except NotFound:
        return None
    try:
        decided = RestoreDecision.model_validate(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
        raise InvalidState(f"restore decision {restore_id} of checkpoint {checkpoint_id} is malformed: {exc}") from None
    if decided.schema_version != SCHEMA_VERSION or (decided.checkpoint_id, decided.restore_id) != (checkpoint_id, restore_id):
        raise InvalidState(f"restore decision {restore_id} of checkpoint {checkpoint_id} does not match its key")
    return decided.decision


def settle(storage: Storage, checkpoint_id: str, restore_id: str, proposal: Decision, decided_by: str) -> Decision:
    """Write ``proposal`` unless an outcome exists; return the outcome that holds.

    Raises StorageError when storage cannot be reached (the caller retries or gives up) and
    InvalidState for a malformed decision object.
    """
    body = RestoreDecision(
        schema_version=SCHEMA_VERSION,
        checkpoint_id=checkpoint_id,
        restore_id=restore_id,
        decision=proposal,
        decided_by=decided_by,
    )
    try:
        storage.put_if_absent(layout.restore_decision_key(checkpoint_id, restore_id), body.model_dump_json().encode())
        return proposal
    except AlreadyExists:
        pass
    settled = read_decision(storage, checkpoint_id, restore_id)
    if settled is None:  # pragma: no cover - put said it exists; a store that loses it is broken
        raise InvalidState(f"restore decision {restore_id} exists but cannot be read back")
    return settled


def restore_decisions(storage: Storage, checkpoint_id: str) -> list[tuple[str, str, str]]:
    """(restore id, decision, decided by) of every restore of a checkpoint, for listings."""
    prefix = f"{layout.checkpoint_prefix(checkpoint_id)}/restores"
    rows = []
    for key in storage.list(prefix):
        if not key.endswith(".json"):
            continue
        try:
            decided = RestoreDecision.model_validate(json.loads(storage.get(key)))
            rows.append((decided.restore_id, decided.decision, decided.decided_by))
        except (NotFound, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
            rows.append((key.rsplit("/", 1)[-1][: -len(".json")], "unreadable", ""))
    return rows
