"""How the policy model records its own calls into the token ledger (``record_tokens``).

Before a call with rollout identity is dispatched its intent is recorded (``begin_call``, the request
digest as call id): a call lost from there on masks its rollout. Once the response is built, and before
it goes out, the call's entry is stored: its :class:`~gym_services.base.tokens.Tokens` on the entry, the
response's output items without them (as NeMo Gym's ``token_id_capture`` moves them), and the lineage stamp
of the request's items (:func:`.lineage.stamp`). A call the engine reported no token ids for is marked
lost instead. Recording never fails the call: a refusal (the rollout frozen meanwhile, a conflicting
payload, already masked) is logged. A response whose tokens the ledger holds names the call in its
``x-ng-token-ledger-call`` header (:data:`LEDGER_CALL_HEADER`): an agent's checkpoint then names the call instead of
writing its tokens again (``docs/decisions.md``, "The agent's transcript names the ledger's tokens").
"""

from __future__ import annotations

from typing import Any

from gym_services.base.errors import ApiError
from gym_services.base.identity import RolloutIdentity
from gym_services.base.logs import get_logger
from gym_services.base.tokens import FIELDS, Tokens
from gym_services.models.policy_model.ledger.lineage import stamp
from gym_services.models.policy_model.ledger.rollouts import TokenLedger
from gym_services.models.policy_model.ledger.wire import LedgerEntry

log = get_logger("policy_model.ledger")
#: the response header naming the ledger call that holds the response's tokens
LEDGER_CALL_HEADER = "x-ng-token-ledger-call"
#: the arrays NeMo Gym moves from a response's output item onto the entry
MOVED_FIELDS = (*FIELDS, "routed_experts")


def call_entry(
    identity: RolloutIdentity,
    model_call_id: str,
    model: str,
    request_items: list[dict[str, Any]] | None,
    response: dict[str, Any],
    tokens: Tokens,
) -> LedgerEntry:
    """The ledger entry of one delivered response: token arrays on the entry, content in output items,
    stamped for lineage from the request's items (a plain-string input has none to continue)."""
    items: list[dict[str, Any]] = []
    carrier = None
    for index, item in enumerate(response.get("output") or []):
        if item.get("generation_token_ids") is not None and carrier is None:
            carrier = index
        items.append({k: v for k, v in item.items() if k not in MOVED_FIELDS})
    entry = LedgerEntry.of_call(
        identity.rollout_id,
        model_call_id,
        tokens,
        model=model,
        output_items=items,
        token_item_index=carrier,
        response_id=response.get("id"),
        created_at=float(response.get("created_at") or 0.0),
        cum_len=len(tokens.sequence()),
    )
    return stamp(entry, request_items) if request_items is not None else entry


def record_call(
    ledger: TokenLedger,
    identity: RolloutIdentity,
    model_call_id: str,
    model: str,
    request_items: list[dict[str, Any]] | None,
    response: dict[str, Any],
    tokens: Tokens | None,
) -> bool:
    """Store the call's entry before the response goes out (``tokens`` None: the call is marked lost); True when
    the ledger holds the call's tokens (stored now, or the same payload before)."""
    try:
        if tokens is None:
            ledger.mark_incomplete(
                identity.rollout_id, model_call_id, identity.attempt, "the upstream returned no token ids"
            )
            return False
        entry = call_entry(identity, model_call_id, model, request_items, response, tokens)
        ledger.put(entry, identity.attempt)
        return True
    except ApiError as exc:  # a conflicting payload (already masked), or the rollout frozen meanwhile
        log.warning(
            "recording the call's tokens failed",
            extra={"rollout_id": identity.rollout_id, "code": exc.code, "error": exc.message},
        )
        return False
