"""The Gymnasium loop of NeMo Gym's gymnasium agent (see ``agents/README.md``): ``/reset`` then (model -> ``/step``)*,
summing rewards.

Boundaries: ``reset``; ``generate`` before every model call; ``step`` before every
``/step`` (holding the model response to act on); ``close`` before the optional
``/close``; ``return``. Generation is a replay step. Reset, step and close change the
environment, so they are waited steps: prepare lets them finish and the boundary after
them (with the environment's cookies) is what a checkpoint holds.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gym_services.agents.common import MODEL, AgentLoop, Boundary, StepContext, StepKind
from gym_services.agents.common.steps import as_items, given_params, output_items
from gym_services.base import nemo_responses

ENV = "env"


class GymBoundary(Boundary):
    model_calls: int = Field(default=0, ge=0)
    steps: int = Field(default=0, ge=0)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] | None = Field(default=None, description="the model response the next /step acts on")
    last_response: dict[str, Any] | None = None
    explicit_close: bool = False
    step_idempotency: bool = False


def user_message(text: Any) -> list[dict[str, Any]]:
    """An observation as the user message that follows it (none for an empty or missing observation)."""
    return [{"content": text, "role": "user"}] if isinstance(text, str) and text else []


class GymnasiumLoop(AgentLoop):
    kind = "gymnasium_agent"
    boundary_model = GymBoundary

    def __init__(self, model: str | None, *, max_steps: int = 10) -> None:
        self.model = model
        self.max_steps = max_steps

    def initial(self, row: dict[str, Any]) -> GymBoundary:
        rcp = row.get("responses_create_params") or {}
        return GymBoundary(name="reset", row=row, input=as_items(rcp.get("input")))

    def step_kind(self, boundary: Boundary) -> StepKind:
        return StepKind.REPLAY if boundary.name == "generate" else StepKind.WAITED

    def _env_body(self, b: GymBoundary, **fields: Any) -> dict[str, Any]:
        """The task row as NeMo Gym's agent passes it to ``/reset`` and ``/step``, plus ``fields``."""
        return {**nemo_responses.run_row(b.row), **fields}

    async def advance(self, ctx: StepContext, b: Boundary) -> Boundary:
        assert isinstance(b, GymBoundary)
        if b.name == "reset":
            reply = await ctx.call(ENV, "/reset", self._env_body(b), b)
            data = reply.body if isinstance(reply.body, dict) else {}
            raw_info = data.get("info")
            info = raw_info if isinstance(raw_info, dict) else {}
            return b.next(
                "generate",
                input=b.input + user_message(data.get("observation")),
                info=info,
                explicit_close=info.get("supports_explicit_close") is True,
                step_idempotency=info.get("supports_step_idempotency") is True,
                cookies=b.with_cookies(ENV, reply.cookies),
            )
        if b.name == "generate":
            reply = await ctx.generate(b, {**given_params(b.row, self.model), "input": b.input + b.outputs})
            response = reply.body if isinstance(reply.body, dict) else {}
            output = output_items(response)
            full = nemo_responses.response(response)
            return b.next(
                "step",
                outputs=b.outputs + output,
                usage=b.usage.plus(response.get("usage")),
                model_calls=b.model_calls + 1,
                response=full,
                last_response=full,
                cookies=b.with_cookies(MODEL, reply.cookies),
            )
        if b.name == "step":
            return await self._step(ctx, b)
        if b.name == "close":
            reply = await ctx.call(ENV, "/close", {}, b)
            return b.finish(self.result(b), cookies=b.with_cookies(ENV, reply.cookies))
        raise ValueError(f"gymnasium_agent has no step after boundary {b.name!r}")

    async def _step(self, ctx: StepContext, b: GymBoundary) -> Boundary:
        fields: dict[str, Any] = {"response": b.response}
        if b.step_idempotency and ctx.identity is not None:
            # the same id for the same step in every attempt: a step repeated after a restore is recognised
            fields["_ng_step_request_id"] = f"{ctx.identity.rollout_id}:{b.steps}"
        reply = await ctx.call(ENV, "/step", self._env_body(b, **fields), b)
        data = reply.body if isinstance(reply.body, dict) else {}
        raw_info = data.get("info")
        info = raw_info if isinstance(raw_info, dict) else {}
        terminated, truncated = bool(data.get("terminated")), bool(data.get("truncated"))
        outputs = b.outputs
        if not (terminated or truncated):
            # what the environment answered goes to the model only when the episode goes on
            outputs = outputs + [
                {"call_id": o.get("call_id"), "output": o.get("output"), "type": "function_call_output"}
                for o in info.get("tool_outputs") or []
                if isinstance(o, dict)
            ]
            outputs += user_message(data.get("observation"))
        steps = b.steps + 1
        if not (terminated or truncated) and steps >= self.max_steps:
            truncated = True  # out of steps: stop without another action
        state = {
            "outputs": outputs,
            "steps": steps,
            "reward": b.reward + float(data.get("reward") or 0.0),
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
            "response": None,
            "cookies": b.with_cookies(ENV, reply.cookies),
        }
        if not (terminated or truncated):
            return b.next("generate", **state)
        ended = b.next("close", **state)
        assert isinstance(ended, GymBoundary)
        return ended if b.explicit_close else ended.finish(self.result(ended))

    def result(self, b: GymBoundary) -> dict[str, Any]:
        rcp = b.row.get("responses_create_params") or {}
        params = nemo_responses.create_params({**rcp, "input": b.input})
        response = nemo_responses.response(
            {**(b.last_response or {}), "output": b.outputs, "usage": b.usage.response_usage()}
        )
        return {
            "responses_create_params": params,
            "response": response,
            "reward": b.reward,
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            "terminated": b.terminated,
            "truncated": b.truncated,
            "info": b.info,
        }

    async def on_error(self, ctx: StepContext, boundary: Boundary, error: Exception) -> None:
        """Close the environment session after a failure when it asks for explicit closes."""
        if isinstance(boundary, GymBoundary) and boundary.explicit_close and boundary.name != "close":
            await ctx.call(ENV, "/close", {}, boundary)
