"""The seed -> generate -> verify -> correct loop of REFERENCE B.6, one step per boundary.

Boundaries (seeds/004): ``seed`` before ``/seed_session``; ``generate`` before each policy
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
from gym_services.agents.common.steps import RESOURCES, as_items, seed_resources, verify_step_kind

#: sampling settings a correction turn keeps from the task's create params
KEPT_PARAMS = ("temperature", "max_output_tokens", "max_tokens", "top_p")


class ProofBoundary(Boundary):
    turn_index: int = Field(default=0, ge=0)
    params: dict[str, Any] = Field(default_factory=dict, description="create params of the next generation, but input")
    response: dict[str, Any] | None = Field(default=None, description="the proof generated this turn (verify boundary)")
    attempts: list[dict[str, Any]] = Field(default_factory=list, description="completed turns")


def first_output_text(response: dict[str, Any] | None) -> str:
    """The first ``output_text`` of the response (the proof as the model wrote it)."""
    if not response:
        return ""
    if isinstance(response.get("output_text"), str):
        return response["output_text"]
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        for part in content or []:
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                return part["text"]
    return ""


class ProofRefinementLoop(AgentLoop):
    kind = "proof_refinement_agent"
    boundary_model = ProofBoundary

    def __init__(self, model: str, *, max_correction_turns: int = 0, include_all_attempts: bool = True) -> None:
        self.model = model
        self.max_correction_turns = max_correction_turns
        self.include_all_attempts = include_all_attempts

    def initial(self, row: dict[str, Any]) -> ProofBoundary:
        rcp = dict(row.get("responses_create_params") or {})
        items = as_items(rcp.pop("input", None))
        return ProofBoundary(name="seed", row=row, input=items, params=rcp)

    def step_kind(self, boundary: Boundary) -> StepKind:
        if boundary.name == "verify":
            return verify_step_kind(boundary)
        return StepKind.REPLAY

    async def advance(self, ctx: StepContext, b: Boundary) -> Boundary:
        assert isinstance(b, ProofBoundary)
        if b.name == "seed":
            return await seed_resources(ctx, b)
        if b.name == "generate":
            reply = await ctx.generate(b, {**b.params, "model": self.model, "input": b.input})
            response = reply.body if isinstance(reply.body, dict) else {}
            return b.next(
                "verify",
                response=response,
                usage=b.usage.plus(response.get("usage")),
                cookies=b.with_cookies(MODEL, reply.cookies),
            )
        if b.name == "verify":
            return await self._verify(ctx, b)
        raise ValueError(f"proof_refinement_agent has no step after boundary {b.name!r}")

    async def _verify(self, ctx: StepContext, b: ProofBoundary) -> Boundary:
        body = {**b.row, "response": b.response, "turn_index": b.turn_index}
        reply = await ctx.call(RESOURCES, "/verify", body, b)
        verdict = reply.body if isinstance(reply.body, dict) else {}
        cookies = b.with_cookies(RESOURCES, reply.cookies)
        attempt = {
            "turn_index": b.turn_index,
            "input": b.input,
            "response": b.response,
            "generation": first_output_text(b.response),
            "proof_status": verdict.get("proof_status"),
            "reward": verdict.get("reward"),
            "error_feedback": verdict.get("error_feedback"),
            "correction_prompt": verdict.get("correction_prompt"),
        }
        attempts = b.attempts + [attempt]
        prompt = verdict.get("correction_prompt")
        done = (
            not verdict.get("needs_correction")
            or self.max_correction_turns - b.turn_index <= 0
            or not isinstance(prompt, str)
            or not prompt
        )
        if done:
            result = {**verdict, "total_turns": b.turn_index + 1}
            if self.include_all_attempts:
                result["all_attempts"] = attempts
            return b.finish(result, attempts=attempts, cookies=cookies, response=None)
        original = b.row.get("responses_create_params") or {}
        params = {k: original[k] for k in KEPT_PARAMS if k in original}
        return b.next(
            "generate",
            turn_index=b.turn_index + 1,
            input=[{"role": "user", "content": prompt}],
            params=params,
            response=None,
            attempts=attempts,
            cookies=cookies,
        )
