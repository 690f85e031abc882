"""The token ledger's wire vocabulary: one typed model per body of the ``/v1/ledger/*`` routes.

Both ends use these models: the policy model's routes (:mod:`.routes`) and every client (a trainer's
transport, :mod:`.client`, the conformance adapter in ``tests/conformance/ledger_adapter.py``). The module
imports nothing but pydantic and :mod:`gym_services.base.tokens` (the standard library only), so a client
in another environment can load it from the source tree.

:class:`LedgerEntry` is one model call's training record with NeMo Gym 0.7.0's field names
(``TokenEntry`` in ``nemo_gym/token_id_capture/records.py``): rollout and call identity, the call's
:class:`~gym_services.base.tokens.Tokens` (the prompt's token ids, the generated token ids and their
log-probs), the output items, and the lineage fields. Fields this model does not name are kept as they
came (a newer optional field survives a round trip); a record of a newer ``schema_version`` is refused, as
NeMo Gym's reader refuses it. ``snapshot_id`` is NeMo Gym's name for the id of one freeze of a rollout.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_services.base.tokens import Tokens

#: the ``TokenEntry`` schema version this ledger reads and writes
ENTRY_SCHEMA_VERSION = 1
ROLLOUT_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
CALL_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"


class LedgerEntry(BaseModel):
    """One model call's training tokens (NeMo Gym's ``TokenEntry`` fields)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = ENTRY_SCHEMA_VERSION
    rollout_id: str = Field(pattern=ROLLOUT_ID)
    model_call_id: str = Field(pattern=CALL_ID)
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    response_id: str | None = None
    created_at: float = 0.0
    parent_call_id: str | None = None
    cum_len: int | None = None
    digest: str | None = None
    continuation_fingerprint: str = ""
    continuation_context_len: int = Field(default=0, ge=0)
    continuation_context_digest: str = ""
    fingerprint_version: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LedgerEntry:
        if self.schema_version != ENTRY_SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (this ledger reads {ENTRY_SCHEMA_VERSION})"
            )
        if any(t < 0 for t in self.prompt_token_ids) or any(t < 0 for t in self.generation_token_ids):
            raise ValueError("token ids must be non-negative")
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"generation_token_ids ({len(self.generation_token_ids)}) and generation_log_probs "
                f"({len(self.generation_log_probs)}) must have the same length"
            )
        if self.token_item_index is not None and not 0 <= self.token_item_index < len(self.output_items):
            raise ValueError(
                f"token_item_index {self.token_item_index} is outside output_items ({len(self.output_items)})"
            )
        return self

    @classmethod
    def of_call(cls, rollout_id: str, model_call_id: str, tokens: Tokens, **fields: Any) -> LedgerEntry:
        """The entry of one call: its identity, its tokens, and any other fields (output items, lineage)."""
        return cls(rollout_id=rollout_id, model_call_id=model_call_id, **tokens.fields(), **fields)

    def tokens(self) -> Tokens:
        return Tokens.of(self.prompt_token_ids, self.generation_token_ids, self.generation_log_probs)

    def canonical(self) -> str:
        """The entry's identity for idempotency, and its stored form: its JSON, named fields in their
        declared order, other fields as they came (a retry resends the same payload, so the same string)."""
        return self.model_dump_json()


class PutEntry(BaseModel):
    """``POST /v1/ledger/put``: store one call's entry, durable and visible once answered."""

    model_config = ConfigDict(extra="forbid")

    entry: LedgerEntry


class PutResult(BaseModel):
    stored: bool = Field(description="false when the same payload was already stored (an idempotent retry)")
    version: int


class CallRef(BaseModel):
    """``POST /v1/ledger/begin_call`` (an intent before dispatch) and ``/mark_incomplete`` (a lost call)."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ROLLOUT_ID)
    model_call_id: str = Field(default="", pattern=r"^$|" + CALL_ID)
    reason: str = Field(default="", max_length=200)


class CallResult(BaseModel):
    version: int


class RolloutRef(BaseModel):
    """``POST /v1/ledger/freeze``."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ROLLOUT_ID)


class FrozenRollout(BaseModel):
    """``POST /v1/ledger/freeze``'s answer (NeMo Gym's ``TokenCaptureSnapshot``): a frozen rollout's entries,
    and whether it must be masked (``incomplete``); ``snapshot_id`` and ``version`` name this freeze for
    ``drop``."""

    rollout_id: str
    attempt: int
    entries: list[LedgerEntry]
    incomplete: bool
    snapshot_id: str
    version: int
    #: why the rollout is incomplete: call id ("" when the writer named none) -> reason
    lost_calls: dict[str, str] = Field(default_factory=dict)


class DropRequest(BaseModel):
    """``POST /v1/ledger/drop``: retire exactly the frozen rollout that was consumed."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ROLLOUT_ID)
    snapshot_id: str = Field(min_length=1)
    version: int = Field(ge=0)


class DropResult(BaseModel):
    dropped: bool = Field(description="false when the rollout changed after the freeze (its rows are kept)")


class TokensRequest(BaseModel):
    """``POST /v1/ledger/tokens``: the tokens stored for these calls of the rollout, in this order; answered in
    binary (``application/octet-stream``: each call's tokens written against the previous one's,
    :func:`gym_services.base.token_codec.encode_all`). A restored agent reads back what its checkpoint named."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ROLLOUT_ID)
    model_call_ids: list[str] = Field(min_length=1, max_length=10_000)


class ResolveRequest(BaseModel):
    """``POST /v1/ledger/resolve``: which stored call of the rollout these request items continue."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ROLLOUT_ID)
    request_items: list[dict[str, Any]]


class ResolutionStatus(enum.StrEnum):
    """NeMo Gym's ``ParentResolutionStatus`` values."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


class Resolution(BaseModel):
    """A request's parent: ``resolved`` names exactly one stored call, with its prompt + generation ids."""

    status: ResolutionStatus
    model_call_id: str | None = None
    cumulative_token_ids: list[int] = Field(default_factory=list)
    digest: str = ""
    reason: str = ""

    @model_validator(mode="after")
    def _match_iff_resolved(self) -> Resolution:
        if (self.status == ResolutionStatus.RESOLVED) != (self.model_call_id is not None):
            raise ValueError("a resolved parent names its call; root and unresolved name none")
        return self
