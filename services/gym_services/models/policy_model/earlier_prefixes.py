"""The prefix records earlier code wrote, read only (``prefixes`` writes schema 5 and resolves what these name):

- schema 4: one binary record beside its prompt record, the text in its JSON header, the generated ids and log-probs
  written against the prompt record's prompt;
- schema 3: one binary record, its prompt written against the ledger entry its header names (``base``), or whole;
- schema 2: JSON with ``prompt_token_ids``, ``token_ids``, ``log_probs``;
- schema 1: JSON, text only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_services.base import token_codec
from gym_services.base.tokens import Tokens

#: the binary schemas read here
BINARY_SCHEMA_VERSIONS = (3, 4)
#: schema versions of the JSON records read here (1: text only, 2: token ids as JSON)
READABLE_SCHEMA_VERSIONS = (1, 2)


class _Prefix(BaseModel):
    """What every earlier schema holds of a generation: its identity, its text and its counts."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    text: str
    complete: bool
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int = Field(ge=0)


class PrefixRecord(_Prefix):
    """The JSON format of schema 1 and 2 (read only)."""

    schema_version: int
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    log_probs: list[float] | None = None

    @model_validator(mode="after")
    def _complete_has_reason(self) -> PrefixRecord:
        if self.schema_version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (want one of {READABLE_SCHEMA_VERSIONS})"
            )
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        if self.schema_version == 1:
            if self.token_ids is not None or self.log_probs is not None or self.prompt_token_ids is not None:
                raise ValueError("a schema 1 record holds no token ids")
            return self
        if self.token_ids is None or self.log_probs is None:
            raise ValueError("a schema 2 record needs token_ids and log_probs")
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.token_ids)} token_ids but {len(self.log_probs)} log_probs")
        if len(self.token_ids) != self.completion_tokens:
            raise ValueError(f"completion_tokens {self.completion_tokens} but {len(self.token_ids)} token_ids")
        if self.token_ids and self.prompt_token_ids is None:
            raise ValueError("generated token ids need the prompt's token ids to be continued")
        return self

    def tokens(self) -> Tokens | None:
        """The record's tokens; None for a text-only one (schema 1, or schema 2 without the prompt's ids)."""
        if self.token_ids is None or self.log_probs is None or self.prompt_token_ids is None:
            return None
        return Tokens.of(self.prompt_token_ids, self.token_ids, self.log_probs)


class PrefixHead(_Prefix):
    """Schema 3 and 4's JSON header (read only); the tokens follow it. Schema 4: written against the prompt record's
    prompt. Schema 3: written against ledger entry ``base``, or against nothing."""

    schema_version: Literal[3, 4]
    tokens: bool
    base: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _complete_has_reason(self) -> PrefixHead:
        if self.complete and self.finish_reason is None:
            raise ValueError("a complete response needs its finish_reason")
        if self.base is not None and (not self.tokens or self.schema_version != 3):
            raise ValueError("only a schema 3 record with tokens is written against a ledger entry")
        return self


def read_binary(data: bytes) -> tuple[PrefixHead, token_codec.Decoded | None]:
    """A schema 3 or 4 record's header and its tokens' triple (None for ``tokens: false``), relative to what it is
    written against; raises ``ValidationError`` or ``TokenCodecError``."""
    view = memoryview(data)
    size, offset = token_codec.read_varint(view, 1)
    head = PrefixHead.model_validate_json(bytes(view[offset : offset + size]))
    if head.schema_version != view[0]:
        raise token_codec.TokenCodecError(f"layout {view[0]} but schema_version {head.schema_version}")
    if not head.tokens:
        if offset + size != len(view):
            raise token_codec.TokenCodecError("bytes after the header")
        return head, None
    triple, end = token_codec.decode(view, offset + size)
    if end != len(view):
        raise token_codec.TokenCodecError("bytes after the tokens")
    return head, triple
