"""The seed -> generate -> verify -> correct loop of NeMo Gym's proof refinement agent, one step per boundary.

Boundaries (``agents/README.md``): ``seed`` before ``/seed_session``; ``generate`` before each policy
call, holding the current input and the completed attempts; ``verify`` before each
``/verify``, holding the generated proof; ``return`` once the final result is known.
Seed and generation are replay steps; verification is a replay step only when the
resources server says so in its seed reply (``x-ng-checkpoint-verify: replay``).
At most ``max_correction_turns + 1`` generations.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gym_services.agents.common import MODEL, AgentLoop, Boundary, StepContext, StepKind
from gym_services.agents.common.steps import RESOURCES, as_items, given_params, seed_resources, verify_step_kind
from gym_services.base import nemo_responses

#: sampling settings a correction turn keeps from the task's create params (when set)
KEPT_PARAMS = ("temperature", "top_p")


class ProofBoundary(Boundary):
    turn_index: int = Field(default=0, ge=0)
    params: dict[str, Any] = Field(default_factory=dict, description="create params of the next generation, but input")
    sent: dict[str, Any] | None = Field(
        default=None, description="this turn's create params as recorded in its attempt"
    )
    response: dict[str, Any] | None = Field(default=None, description="the proof generated this turn (verify boundary)")
    attempts: list[dict[str, Any]] = Field(default_factory=list, description="completed turns")


def generation_text(response: dict[str, Any] | None) -> str:
    """The proof text of a turn: the first ``output_text`` part of the last message that has one."""
    text = ""
    for item in (response or {}).get("output") or []:
        if not isinstance(item, dict) or item.get("type") != "message" or not item.get("content"):
            continue
        for part in item["content"]:
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text", "")
                break
    return text


class ProofRefinementLoop(AgentLoop):
    kind = "proof_refinement_agent"
    boundary_model = ProofBoundary

    def __init__(self, model: str | None, *, max_correction_turns: int = 0, include_all_attempts: bool = True) -> None:
        self.model = model
        self.max_correction_turns = max_correction_turns
        self.include_all_attempts = include_all_attempts

    def initial(self, row: dict[str, Any]) -> ProofBoundary:
        rcp = row.get("responses_create_params") or {}
        # the first turn's attempt records the task's create params in full
        sent = nemo_responses.create_params(dict(rcp) if "input" in rcp else {**rcp, "input": []})
        return ProofBoundary(
            name="seed", row=row, input=as_items(rcp.get("input")), params=given_params(row, self.model), sent=sent
        )

    def step_kind(self, boundary: Boundary) -> StepKind:
        if boundary.name == "verify":
            return verify_step_kind(boundary)
        return StepKind.REPLAY

    async def advance(self, ctx: StepContext, b: Boundary) -> Boundary:
        assert isinstance(b, ProofBoundary)
        if b.name == "seed":
            return await seed_resources(ctx, b)
        if b.name == "generate":
            reply = await ctx.generate(b, {**b.params, "input": b.input})
            response = reply.body if isinstance(reply.body, dict) else {}
            return b.next(
                "verify",
                response=nemo_responses.response(response),
                usage=b.usage.plus(response.get("usage")),
                cookies=b.with_cookies(MODEL, reply.cookies),
            )
        if b.name == "verify":
            return await self._verify(ctx, b)
        raise ValueError(f"proof_refinement_agent has no step after boundary {b.name!r}")

    async def _verify(self, ctx: StepContext, b: ProofBoundary) -> Boundary:
        body = {**nemo_responses.run_row(b.row), "response": b.response, "turn_index": b.turn_index}
        reply = await ctx.call(RESOURCES, "/verify", body, b)
        verdict = reply.body if isinstance(reply.body, dict) else {}
        cookies = b.with_cookies(RESOURCES, reply.cookies)
        attempt = {
            "turn_index": b.turn_index,
            "input": b.sent,
            "response": b.response,
            "generation": generation_text(b.response),
            "proof_status": verdict.get("proof_status", "unknown"),
            "reward": verdict.get("reward", 0.0),
            "error_feedback": verdict.get("error_feedback"),
            "correction_prompt": verdict.get("correction_prompt"),
        }
        attempts = [*b.attempts, attempt]
        prompt = verdict.get("correction_prompt")
        done = not verdict.get("needs_correction", False) or self.max_correction_turns - b.turn_index <= 0 or not prompt
        if done:
            result = {
                **verdict,
                "total_turns": b.turn_index + 1,
                "all_attempts": attempts if self.include_all_attempts else None,
            }
            return b.finish(nemo_responses.verify_answer(result), attempts=attempts, cookies=cookies, response=None)
        original = b.row.get("responses_create_params") or {}
        # a correction turn: the prompt alone, the task's model (null when it names none) and its sampling settings
        params: dict[str, Any] = {"model": self.model if self.model is not None else original.get("model")}
        params.update({k: original[k] for k in KEPT_PARAMS if original.get(k) is not None})
        following = [{"content": prompt, "role": "user"}]
        return b.next(
            "generate",
            turn_index=b.turn_index + 1,
            input=following,
            params=params,
            sent={"input": following, **params},
            response=None,
            attempts=attempts,
            cookies=cookies,
        )
