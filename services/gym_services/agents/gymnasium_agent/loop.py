"""The Gymnasium loop of REFERENCE B.4: ``/reset`` then (model -> ``/step``)*, summing rewards.

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
from gym_services.agents.common.steps import as_items

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
    return [{"role": "user", "content": text}] if isinstance(text, str) and text else []


class GymnasiumLoop(AgentLoop):
    kind = "gymnasium_agent"
    boundary_model = GymBoundary

    def __init__(self, model: str, *, max_steps: int = 10) -> None:
        self.model = model
        self.max_steps = max_steps

    def initial(self, row: dict[str, Any]) -> GymBoundary:
        rcp = row.get("responses_create_params") or {}
        return GymBoundary(name="reset", row=row, input=as_items(rcp.get("input")))

    def step_kind(self, boundary: Boundary) -> StepKind:
        return StepKind.REPLAY if boundary.name == "generate" else StepKind.WAITED

    def _env_body(self, b: GymBoundary, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"responses_create_params": b.row.get("responses_create_params") or {}}
        if "extra" in b.row:
            body["extra"] = b.row["extra"]
        body.update(fields)
        return body

    async def advance(self, ctx: StepContext, b: Boundary) -> Boundary:
        assert isinstance(b, GymBoundary)
        if b.name == "reset":
            reply = await ctx.call(ENV, "/reset", self._env_body(b), b)
            data = reply.body if isinstance(reply.body, dict) else {}
            info = data.get("info") if isinstance(data.get("info"), dict) else {}
            return b.next(
                "generate",
                input=b.input + user_message(data.get("observation")),
                info=info,
                explicit_close=bool(info.get("supports_explicit_close")),
                step_idempotency=bool(info.get("supports_step_idempotency")),
                cookies=b.with_cookies(ENV, reply.cookies),
            )
        if b.name == "generate":
            params = {**(b.row.get("responses_create_params") or {}), "model": self.model, "input": b.input + b.outputs}
            reply = await ctx.generate(b, params)
            response = reply.body if isinstance(reply.body, dict) else {}
            output = [item for item in response.get("output") or [] if isinstance(item, dict)]
            return b.next(
                "step",
                outputs=b.outputs + output,
                usage=b.usage.plus(response.get("usage")),
                model_calls=b.model_calls + 1,
                response=response,
                last_response=response,
                cookies=b.with_cookies(MODEL, reply.cookies),
            )
        if b.name == "step":
            return await self._step(ctx, b)
        if b.name == "close":
            reply = await ctx.call(ENV, "/close", self._env_body(b), b)
            return b.finish(self.result(b), cookies=b.with_cookies(ENV, reply.cookies))
        raise ValueError(f"gymnasium_agent has no step after boundary {b.name!r}")

    async def _step(self, ctx: StepContext, b: GymBoundary) -> Boundary:
        fields: dict[str, Any] = {"response": b.response}
        if b.step_idempotency and ctx.identity is not None:
            fields["_ng_step_request_id"] = f"{ctx.identity.rollout_id}:{b.steps}"
        reply = await ctx.call(ENV, "/step", self._env_body(b, **fields), b)
        data = reply.body if isinstance(reply.body, dict) else {}
        info = data.get("info") if isinstance(data.get("info"), dict) else {}
        outputs = b.outputs + [
            {"type": "function_call_output", "call_id": o.get("call_id"), "output": o.get("output")}
            for o in info.get("tool_outputs") or []
            if isinstance(o, dict)
        ]
        outputs += user_message(data.get("observation"))
        terminated, truncated = bool(data.get("terminated")), bool(data.get("truncated"))
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
        response = {**(b.last_response or {}), "output": b.outputs, "usage": b.usage.model_dump()}
        return {
            "reward": b.reward,
            "terminated": b.terminated,
            "truncated": b.truncated,
            "info": b.info,
            "response": response,
            "responses_create_params": b.row.get("responses_create_params") or {},
        }

    async def on_error(self, ctx: StepContext, boundary: Boundary, error: Exception) -> None:
        """Close the environment session after a failure when it asks for explicit closes."""
        if isinstance(boundary, GymBoundary) and boundary.explicit_close and boundary.name != "close":
            await ctx.call(ENV, "/close", self._env_body(boundary), boundary)
