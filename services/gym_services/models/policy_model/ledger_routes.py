"""The capture ledger over HTTP (``docs/protocol.md``, "The capture ledger"), and its capture hook.

Routes (bodies in :mod:`.ledger_wire`; every one is ``GATED``: refused with ``409 checkpoint_parked``
while a checkpoint is open, so a checkpoint holds the ledger exactly as the trainer saw it):

``POST /v1/ledger/put``              store one entry (sink ``put``)
``POST /v1/ledger/begin_call``       record an intent before dispatch (sink ``begin_call``)
``POST /v1/ledger/mark_incomplete``  record a lost call (sink ``mark_incomplete``)
``POST /v1/ledger/freeze``           freeze and read a rollout (source ``freeze``)
``POST /v1/ledger/drop``             retire the consumed snapshot (source ``drop``)
``POST /v1/ledger/resolve``          the stored call a request continues (``LineageResolver.resolve``)

Writes carry the rollout's identity headers (``x-ng-rollout-id``, ``x-ng-attempt``), like every data
call: the admission middleware refuses an attempt older than the newest seen, and the ledger refuses
one older than the attempt its rows belong to (after a restore: attempt + 1). Reads need none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.identity import RolloutIdentity
from gym_services.models.policy_model.generations import Generation
from gym_services.models.policy_model.ledger import CaptureLedger
from gym_services.models.policy_model.ledger_lineage import stamp
from gym_services.models.policy_model.ledger_wire import (
    CallRef,
    CallResult,
    DropRequest,
    DropResult,
    LedgerEntry,
    PutEntry,
    PutResult,
    ResolveRequest,
    RolloutRef,
)

#: the token arrays NeMo Gym moves from a response's output item onto the entry
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


def _writer(request: Request, rollout_id: str) -> int:
    """The attempt of a write; its identity headers must name the rollout it writes."""
    identity = RolloutIdentity.from_headers(request.headers)
    if identity is None:
        raise ApiError(ErrorCode.ROLLOUT_ID_REQUIRED, "ledger writes need the x-ng-rollout-id and x-ng-attempt headers")
    if identity.rollout_id != rollout_id:
        raise ApiError(
            ErrorCode.BAD_REQUEST,
            f"the x-ng-rollout-id header names {identity.rollout_id!r} but the body writes rollout {rollout_id!r}",
        )
    return identity.attempt


def ledger_routes(ledger: CaptureLedger) -> list[Route]:
    async def put(request: Request) -> Response:
        body = await parse_body(request, PutEntry)
        stored, version = ledger.put(body.entry, _writer(request, body.entry.rollout_id))
        return JSONResponse(PutResult(stored=stored, version=version).model_dump(mode="json"))

    async def begin_call(request: Request) -> Response:
        body = await parse_body(request, CallRef)
        if not body.model_call_id:
            raise ApiError(ErrorCode.BAD_REQUEST, "begin_call needs a model_call_id")
        version = ledger.begin_call(body.rollout_id, body.model_call_id, _writer(request, body.rollout_id))
        return JSONResponse(CallResult(version=version).model_dump(mode="json"))

    async def mark_incomplete(request: Request) -> Response:
        body = await parse_body(request, CallRef)
        version = ledger.mark_incomplete(
            body.rollout_id, body.model_call_id, _writer(request, body.rollout_id), body.reason
        )
        return JSONResponse(CallResult(version=version).model_dump(mode="json"))

    async def freeze(request: Request) -> Response:
        body = await parse_body(request, RolloutRef)
        return JSONResponse(ledger.freeze(body.rollout_id).model_dump(mode="json"))

    async def drop(request: Request) -> Response:
        body = await parse_body(request, DropRequest)
        dropped = ledger.drop(body.rollout_id, body.snapshot_id, body.version)
        return JSONResponse(DropResult(dropped=dropped).model_dump(mode="json"))

    async def resolve(request: Request) -> Response:
        body = await parse_body(request, ResolveRequest)
        try:
            resolution = ledger.resolve(body.rollout_id, body.request_items)
        except ValueError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, f"request_items cannot be resolved: {exc}") from None
        return JSONResponse(resolution.model_dump(mode="json"))

    return [
        Route("/v1/ledger/resolve", resolve, methods=["POST"]),
        Route("/v1/ledger/put", put, methods=["POST"]),
        Route("/v1/ledger/begin_call", begin_call, methods=["POST"]),
        Route("/v1/ledger/mark_incomplete", mark_incomplete, methods=["POST"]),
        Route("/v1/ledger/freeze", freeze, methods=["POST"]),
        Route("/v1/ledger/drop", drop, methods=["POST"]),
    ]


@dataclass(frozen=True)
class CallTokens:
    """What one finished generation contributes to training: its prompt's token ids, the generated
    token ids and their log-probs, as sampled (NeMo Gym's field names)."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


def call_tokens(generation: Generation) -> CallTokens | None:
    """The finished generation's token information (NeMo Gym's three fields), or None when the upstream
    reported none (a text-only restored prefix, an engine without token ids)."""
    try:
        fields = generation.token_information()
    except ApiError:
        return None
    return CallTokens(
        list(fields["prompt_token_ids"]), list(fields["generation_token_ids"]), list(fields["generation_log_probs"])
    )


def capture_entry(
    identity: RolloutIdentity,
    model_call_id: str,
    model: str,
    request_items: list[dict[str, Any]] | None,
    response: dict[str, Any],
    tokens: CallTokens,
) -> LedgerEntry:
    """The ledger entry of one delivered response: token arrays on the entry, content in output items,
    stamped for lineage from the request's items (a plain-string input has none to continue)."""
    items: list[dict[str, Any]] = []
    carrier = None
    for index, item in enumerate(response.get("output") or []):
        if item.get("generation_token_ids") is not None and carrier is None:
            carrier = index
        items.append({k: v for k, v in item.items() if k not in TOKEN_FIELDS})
    entry = LedgerEntry(
        rollout_id=identity.rollout_id,
        model_call_id=model_call_id,
        model=model,
        prompt_token_ids=tokens.prompt_token_ids,
        generation_token_ids=tokens.generation_token_ids,
        generation_log_probs=tokens.generation_log_probs,
        output_items=items,
        token_item_index=carrier,
        response_id=response.get("id"),
        created_at=float(response.get("created_at") or 0.0),
        cum_len=len(tokens.prompt_token_ids) + len(tokens.generation_token_ids),
    )
    return stamp(entry, request_items) if request_items is not None else entry
