"""Insurance: adjuster notes, claims, claim messages, fraud flags, payouts, policies (plus sending messages).

Environment: ``policies``, ``claims``, ``adjuster_notes``, ``fraud_investigation_flags``, ``payouts``
(dicts keyed by ID, each may be absent), ``messages`` (list or dict), ``current_user``. Records
created here are answered in full; their IDs: notes ``AN-``, claims ``CL-``, fraud flags ``FF-``,
payouts ``PO-``, each with six hex digits.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup


def _file(env, collection: str, id_field: str, record_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    record = {id_field: record_id, **fields}
    env.setdefault(collection, {})[record_id] = record
    return record


def add_adjuster_note(env, claim_id, adjuster_id, note_text) -> dict[str, Any]:
    note_id = new_id("AN-")
    fields = {"claim_id": claim_id, "adjuster_id": adjuster_id, "note_text": note_text, "timestamp": "created"}
    return _file(env, "adjuster_notes", "note_id", note_id, fields)


def get_adjuster_notes_for_claim(env, claim_id) -> list[Any]:
    return [note for note in env.get("adjuster_notes", {}).values() if note.get("claim_id") == claim_id]


def create_claim(
    env, policy_id, claim_number, date_of_loss, description, claim_type, amount_requested, adjuster_id
) -> dict[str, Any]:
    claim_id = new_id("CL-")
    fields = {
        "policy_id": policy_id,
        "claim_number": claim_number,
        "date_of_loss": date_of_loss,
        "description": description,
        "claim_type": claim_type,
        "amount_requested": amount_requested,
        "status": "open",
        "adjuster_id": adjuster_id,
    }
    return _file(env, "claims", "claim_id", claim_id, fields)


def get_claim_by_id(env, claim_id) -> Any:
    return lookup(env.get("claims", {}), claim_id, {"error": f"Claim {claim_id} not found."})


def update_claim_description(env, claim_id, description) -> str:
    claims = env.get("claims", {})
    if claim_id not in claims:
        return f"Error: Claim {claim_id} not found."
    claims[claim_id]["description"] = description
    return f"Claim {claim_id} description updated."


def get_messages_for_claim(env, claim_id) -> list[Any]:
    """Messages tied to the claim by ``related_claim_id`` or ``claim_id``."""
    box = env.get("messages", [])
    if isinstance(box, dict):
        box = list(box.values())
    return [m for m in box if m.get("related_claim_id") == claim_id or m.get("claim_id") == claim_id]


def flag_fraud_investigation(env, claim_id, investigator_id, flag_reason, severity) -> dict[str, Any]:
    flag_id = new_id("FF-")
    fields = {
        "claim_id": claim_id,
        "investigator_id": investigator_id,
        "flag_reason": flag_reason,
        "severity": severity,
        "status": "open",
    }
    return _file(env, "fraud_investigation_flags", "flag_id", flag_id, fields)


def process_payout(env, claim_id, amount, date, method, notes) -> dict[str, Any]:
    payout_id = new_id("PO-")
    fields = {
        "claim_id": claim_id,
        "amount": amount,
        "date": date,
        "method": method,
        "status": "processed",
        "notes": notes,
    }
    return _file(env, "payouts", "payout_id", payout_id, fields)


def get_policy_by_id(env, policy_id) -> Any:
    return lookup(env.get("policies", {}), policy_id, {"error": f"Policy {policy_id} not found."})


def search_policies_by_holder(env, policyholder_name) -> list[Any]:
    needle = policyholder_name.lower()
    return [p for p in env.get("policies", {}).values() if needle in p.get("policyholder_name", "").lower()]


def update_policy_notes(env, policy_id, notes) -> str:
    """Replace the policy's notes."""
    policies = env.get("policies", {})
    if policy_id not in policies:
        return f"Error: Policy {policy_id} not found."
    policies[policy_id]["notes"] = notes
    return f"Policy {policy_id} notes updated."


#: shared tools (tools/common.py) this domain offers too
SHARED = ("send_message",)

TOOLS: dict[str, Handler] = {
    "add_adjuster_note": add_adjuster_note,
    "get_adjuster_notes_for_claim": get_adjuster_notes_for_claim,
    "create_claim": create_claim,
    "get_claim_by_id": get_claim_by_id,
    "update_claim_description": update_claim_description,
    "get_messages_for_claim": get_messages_for_claim,
    "flag_fraud_investigation": flag_fraud_investigation,
    "process_payout": process_payout,
    "get_policy_by_id": get_policy_by_id,
    "search_policies_by_holder": search_policies_by_holder,
    "update_policy_notes": update_policy_notes,
}
