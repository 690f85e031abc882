"""The token ledger over HTTP (``docs/protocol.md``, "The token ledger").

Routes (bodies in :mod:`.wire`; every one is ``GATED``: refused with ``409 checkpoint_parked``
while a checkpoint is open, so a checkpoint holds the ledger exactly as the trainer saw it):

``POST /v1/ledger/put``              store one entry (sink ``put``)
``POST /v1/ledger/begin_call``       record an intent before dispatch (sink ``begin_call``)
``POST /v1/ledger/mark_incomplete``  record a lost call (sink ``mark_incomplete``)
``POST /v1/ledger/freeze``           freeze and read a rollout (source ``freeze``)
``POST /v1/ledger/drop``             retire the consumed freeze (source ``drop``)
``POST /v1/ledger/resolve``          the stored call a request continues (``LineageResolver.resolve``)
``POST /v1/ledger/tokens``           the stored tokens of some calls, in binary (a restored agent reads back
                                     what its checkpoint named)

Writes carry the rollout's identity headers (``x-ng-rollout-id``, ``x-ng-attempt``), like every data
call: the admission middleware refuses an attempt older than the newest seen, and the ledger refuses
one older than the attempt its rows belong to (after a restore: attempt + 1). Reads need none.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_services.base import token_codec
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.identity import RolloutIdentity
from gym_services.models.policy_model.ledger.rollouts import TokenLedger
from gym_services.models.policy_model.ledger.wire import (
    CallRef,
    CallResult,
    DropRequest,
    DropResult,
    PutEntry,
    PutResult,
    ResolveRequest,
    RolloutRef,
    TokensRequest,
)


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


def ledger_routes(ledger: TokenLedger) -> list[Route]:
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

    async def tokens(request: Request) -> Response:
        body = await parse_body(request, TokensRequest)
        found = ledger.tokens(body.rollout_id, body.model_call_ids)
        return Response(token_codec.encode_all(found), media_type="application/octet-stream")

    return [
        Route("/v1/ledger/resolve", resolve, methods=["POST"]),
        Route("/v1/ledger/tokens", tokens, methods=["POST"]),
        Route("/v1/ledger/put", put, methods=["POST"]),
        Route("/v1/ledger/begin_call", begin_call, methods=["POST"]),
        Route("/v1/ledger/mark_incomplete", mark_incomplete, methods=["POST"]),
        Route("/v1/ledger/freeze", freeze, methods=["POST"]),
        Route("/v1/ledger/drop", drop, methods=["POST"]),
    ]
