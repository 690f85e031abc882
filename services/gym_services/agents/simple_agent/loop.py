"""The tool-calling loop of NeMo Gym's simple agent, one step per boundary (``agents/README.md``).

seed -> generate -> (tool)* -> generate -> ... -> verify -> return

Boundaries: ``seed`` (before ``/seed_session``), ``generate`` (before each model call),
``tool`` (before each tool call, holding the function calls still pending), ``verify``
(before ``/verify``) and ``return``. Seed and generation are replay steps; tool calls
are waited steps; verification follows the resources server's verify mode.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from gym_services.agents.common import MODEL, AgentLoop, Boundary, StepContext, StepKind
from gym_services.agents.common.steps import (
    RESOURCES,
    as_items,
    echoes_shared,
    given_params,
    output_items,
    seed_resources,
    verify_step_kind,
)
from gym_services.base import nemo_responses

#: why an episode ended without a message or a function call (``metadata.ng_termination_reason``)
NO_ANSWER_REASONS = {True: "incomplete_reasoning", False: "empty_output"}
NO_ANSWER_MESSAGE = (
    "The model's output had neither an assistant message nor a function call, and no truncation was "
    "reported: the episode ends here, marked incomplete."
)


class SimpleBoundary(Boundary):
    model_calls: int = Field(default=0, ge=0)
    tool_calls: int = Field(default=0, ge=0)
    pending_calls: list[dict[str, Any]] = Field(default_factory=list, description="function calls not yet run")
    last_response: dict[str, Any] | None = Field(default=None, description="the latest model response")


class SimpleAgentLoop(AgentLoop):
    kind = "simple_agent"
    boundary_model = SimpleBoundary

    def __init__(
        self,
        model: str | None,
        *,
        max_steps: int | None = None,
        skip_verification: bool = False,
        skip_verification_reward: float = 0.0,
    ) -> None:
        self.model = model
        self.max_steps = max_steps
        self.skip_verification = skip_verification
        self.skip_verification_reward = skip_verification_reward

    def initial(self, row: dict[str, Any]) -> SimpleBoundary:
        params = row.get("responses_create_params") or {}
        return SimpleBoundary(name="seed", row=row, input=as_items(params.get("input")))

    def step_kind(self, boundary: Boundary) -> StepKind:
        if boundary.name == "tool":
            return StepKind.WAITED
        if boundary.name == "verify":
            return verify_step_kind(boundary)
        return StepKind.REPLAY

    async def advance(self, ctx: StepContext, b: Boundary) -> Boundary:
        assert isinstance(b, SimpleBoundary)
        if b.name == "seed":
            return await seed_resources(ctx, b)
        if b.name == "generate":
            return await self._generate(ctx, b)
        if b.name == "tool":
            return await self._tool(ctx, b)
        if b.name == "verify":
            return await self._verify(ctx, b)
        raise ValueError(f"simple_agent has no step after boundary {b.name!r}")

    def _params(self, b: SimpleBoundary) -> dict[str, Any]:
        return {**given_params(b.row, self.model), "input": b.input + b.outputs}

    async def _generate(self, ctx: StepContext, b: SimpleBoundary) -> Boundary:
        reply = await ctx.generate(b, self._params(b))
        response = echoes_shared(reply.body, b.row) if isinstance(reply.body, dict) else {}
        output = output_items(response)
        calls = [item for item in output if item.get("type") == "function_call"]
        messages = [i for i in output if i.get("type") == "message" and i.get("role", "assistant") == "assistant"]
        if not response.get("incomplete_details") and not calls and not messages:
            # neither an answer nor a call, and no truncation reported: the episode ends as incomplete
            response = {
                **response,
                "status": "incomplete",
                "metadata": {
                    **(response.get("metadata") or {}),
                    "ng_termination_reason": NO_ANSWER_REASONS[bool(output)],
                    "ng_termination_message": NO_ANSWER_MESSAGE,
                },
            }
        common = {
            "outputs": b.outputs + output,
            "usage": b.usage.plus(response.get("usage")),
            "model_calls": b.model_calls + 1,
            "last_response": response,
            "cookies": b.with_cookies(MODEL, reply.cookies),
        }
        if response.get("incomplete_details") or not calls:
            return b.next("verify", pending_calls=[], **common)
        return b.next("tool", pending_calls=calls, **common)

    async def _tool(self, ctx: StepContext, b: SimpleBoundary) -> Boundary:
        call, rest = b.pending_calls[0], b.pending_calls[1:]
        name = str(call.get("name", ""))
        cookies = b.cookies
        arguments = call.get("arguments")
        try:
            if not isinstance(arguments, (str, bytes, bytearray)):  # json.loads's own refusal, as NeMo Gym gets it
                raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(arguments).__name__}")
            args = json.loads(arguments)
        except (TypeError, json.JSONDecodeError) as exc:
            output = json.dumps({"error": f"Invalid tool call arguments: {exc!r}"})
        else:
            # the tool is the route named like it; whatever it answers (an error status too) is what the model sees
            reply = await ctx.call(RESOURCES, f"/{name}", args, b, accept_errors=True)
            output = reply.content.decode("utf-8", "replace")
            cookies = b.with_cookies(RESOURCES, reply.cookies)
        item = {"call_id": call.get("call_id"), "output": output, "type": "function_call_output"}
        if rest:
            following = "tool"
        elif self.max_steps is not None and b.model_calls >= self.max_steps:
            following = "verify"
        else:
            following = "generate"
        return b.next(
            following, outputs=[*b.outputs, item], pending_calls=rest, tool_calls=b.tool_calls + 1, cookies=cookies
        )

    def final_response(self, b: SimpleBoundary) -> dict[str, Any]:
        """The episode's response: the last model response with every output item and the summed usage."""
        response: dict[str, Any] = nemo_responses.response(
            {**(b.last_response or {}), "output": b.outputs, "usage": b.usage.response_usage()}
        )
        return response

    async def _verify(self, ctx: StepContext, b: SimpleBoundary) -> Boundary:
        body = {**nemo_responses.run_row(b.row), "response": self.final_response(b)}
        if self.skip_verification:
            skipped = {**body, "reward": float(self.skip_verification_reward), "verification_skipped": True}
            return b.finish(nemo_responses.verify_answer(skipped))
        reply = await ctx.call(RESOURCES, "/verify", body, b)
        result = reply.body if isinstance(reply.body, dict) else {"verify": reply.body}
        return b.finish(nemo_responses.verify_answer(result), cookies=b.with_cookies(RESOURCES, reply.cookies))
