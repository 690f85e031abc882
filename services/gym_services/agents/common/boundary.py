"""What an episode records before each step, and the record a checkpoint writes for it.

A boundary holds everything an agent needs to continue an episode in a fresh process
(``docs/participants.md``, "Agents"): the task row, the current model input, the output items so
far, usage, the cookies of every downstream server, step counters, completed attempts
and the agent's own fields. Agents subclass :class:`Boundary` with typed fields; the
Python task running the episode is never serialized.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_services.control.models import VerifyMode

RECORD_SCHEMA_VERSION: Final = 1
#: the boundary an episode reaches once its result is known
RETURN = "return"
#: identity fields of a /run body that are not part of the task row
IDENTITY_FIELDS = ("_ng_attempt_index",)


class Usage(BaseModel):
    """Token usage summed over an episode's generations (as NeMo Gym's agents sum it).

    ``reported`` is false until a generation reported usage: an episode without any has no
    usage (``null``). A detail count a generation did not report makes the sum unknown (``null``).
    """

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = 0
    reasoning_tokens: int | None = 0
    reported: bool = False

    def plus(self, reply: Any) -> Usage:
        """This usage plus a Responses API ``usage`` object (``None`` adds nothing)."""
        if not isinstance(reply, dict):
            return self

        def count(key: str) -> int:
            value = reply.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        def detail(total: int | None, details_key: str, key: str) -> int | None:
            details = reply.get(details_key)
            if not isinstance(details, dict):
                return total if self.reported else None
            value = details.get(key)
            if not isinstance(value, int) or isinstance(value, bool):
                return None
            if not self.reported:
                return value
            return None if total is None else total + value

        return Usage(
            input_tokens=self.input_tokens + count("input_tokens"),
            output_tokens=self.output_tokens + count("output_tokens"),
            total_tokens=self.total_tokens + count("total_tokens"),
            cached_tokens=detail(self.cached_tokens, "input_tokens_details", "cached_tokens"),
            reasoning_tokens=detail(self.reasoning_tokens, "output_tokens_details", "reasoning_tokens"),
            reported=True,
        )

    def response_usage(self) -> dict[str, Any] | None:
        """The summed usage as a Responses API ``usage`` object, ``None`` when no generation reported any."""
        if not self.reported:
            return None
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.total_tokens,
        }


class Boundary(BaseModel):
    """The state of an episode just before its next step."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="which step comes next: seed, generate, tool, verify, step, return, ...")
    seq: int = Field(default=0, ge=0, description="boundaries recorded so far in this episode")
    row: dict[str, Any] = Field(description="the task row of /run (identity attempt stripped)")
    input: list[dict[str, Any]] = Field(default_factory=list, description="the model input before outputs")
    outputs: list[dict[str, Any]] = Field(default_factory=list, description="output items so far")
    usage: Usage = Field(default_factory=Usage)
    cookies: dict[str, dict[str, str]] = Field(default_factory=dict, description="downstream server -> cookies")
    verify_mode: VerifyMode | None = Field(default=None, description="from the seed reply's x-ng-checkpoint-verify")
    result: dict[str, Any] | None = Field(default=None, description="the /run reply, once known")

    def next(self, name: str, **updates: Any) -> Boundary:
        """The following boundary: a deep copy of its containers (no aliasing with this one) with ``updates``
        applied. Token arrays (:mod:`gym_services.base.token_arrays`, immutable) are shared, not copied, and so is
        what the task row holds, which no step changes (a row carries the task's tools, and an episode holds two
        boundaries while a step runs: thousands of episodes at once)."""
        data = self.model_dump(exclude={"row"})
        data["row"] = self.row
        data.update({k: (v.model_dump() if isinstance(v, BaseModel) else v) for k, v in updates.items()})
        data["name"] = name
        data["seq"] = self.seq + 1
        return type(self).model_validate(data)

    def finish(self, result: dict[str, Any], **updates: Any) -> Boundary:
        return self.next(RETURN, result=result, **updates)

    def with_cookies(self, server: str, cookies: dict[str, str]) -> dict[str, dict[str, str]]:
        """This boundary's cookie jars with ``server``'s replaced (for ``next(cookies=...)``)."""
        return {**self.cookies, server: dict(cookies)}


class EpisodeRecord(BaseModel):
    """One checkpointed episode: captured at a checkpoint, installed under attempt + 1 at restore."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = RECORD_SCHEMA_VERSION
    kind: Literal["gym-checkpoint/agent-episode"] = "gym-checkpoint/agent-episode"
    agent: str = Field(description="the agent kind that wrote it (records do not cross agents)")
    rollout_id: str
    attempt: int = Field(ge=0, description="the attempt that reached this boundary")
    boundary: dict[str, Any]


def task_row(body: dict[str, Any]) -> dict[str, Any]:
    """The /run body without the attempt, so continuing attempts see the same row."""
    return {k: v for k, v in body.items() if k not in IDENTITY_FIELDS}
