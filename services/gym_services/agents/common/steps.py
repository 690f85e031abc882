"""Steps and input helpers that more than one agent loop uses."""

from __future__ import annotations

from typing import Any

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.context import StepContext
from gym_services.agents.common.loop import StepKind
from gym_services.base import nemo_responses
from gym_services.control.protocol import VERIFY_HEADER, VerifyMode

#: the downstream name of an agent's resources server
RESOURCES = "resources"


def as_items(value: Any) -> list[dict[str, Any]]:
    """Responses ``input`` as items in the given form: a string becomes one user message."""
    if isinstance(value, str):
        return [{"content": value, "role": "user"}]
    if isinstance(value, list):
        return [nemo_responses.item(item, full=False) for item in value if isinstance(item, dict)]
    return []


def given_params(row: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The task's create params as NeMo Gym's agents send them (given form), without ``input``.

    ``model`` (the agent's configured model, if any) replaces the task's own.
    """
    params: dict[str, Any] = nemo_responses.create_params(
        dict(row.get("responses_create_params") or {"input": []}), full=False
    )
    params.pop("input", None)
    if model is not None:
        params["model"] = model
    return params


def output_items(response: dict[str, Any]) -> list[Any]:
    """A model response's output items in the given form, as NeMo Gym's agents keep them. Token fields the episode
    holds as its arrays already (:meth:`StepContext.generate`) stay those arrays (:func:`nemo_responses.item`), not
    lists of Python ints (a long context's prompt: tens of thousands) that recording the boundary turns back into the
    same arrays."""
    return [
        nemo_responses.item(item, full=False, output=True)
        for item in response.get("output") or []
        if isinstance(item, dict)
    ]


#: what a model's response echoes of its request's create params (NeMo Gym's response carries its tools and
#: instructions), under the names both use
ECHOED_PARAMS = ("tools", "instructions")


def echoes_shared(response: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``response`` with each field it echoes of the task's create params made the row's own object where the two are
    equal (the response is otherwise unchanged): a boundary keeps the last response, from which the episode's final
    response is made, beside its row, and a task's tools are most of a long context's first prompt, thousands of
    live episodes at once (``benchmarks/RESULTS.md``, "The agents' copy of the tools")."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return response
    shared = {
        name: params[name]
        for name in ECHOED_PARAMS
        if name in response and name in params and response[name] is not params[name] and response[name] == params[name]
    }
    return {**response, **shared} if shared else response


def verify_mode_of(headers: Any) -> VerifyMode:
    """The resources server's verify mode from its seed reply (``wait`` unless it says ``replay``)."""
    mode = headers.get(VERIFY_HEADER, VerifyMode.WAIT)
    return VerifyMode(mode) if mode in tuple(VerifyMode) else VerifyMode.WAIT


def verify_step_kind(boundary: Boundary) -> StepKind:
    """A ``replay`` verification does not block prepare; a ``wait`` one is waited for."""
    return StepKind.REPLAY if boundary.verify_mode == VerifyMode.REPLAY else StepKind.WAITED


async def seed_resources(ctx: StepContext, b: Boundary) -> Boundary:
    """``/seed_session`` with the task row; the next boundary (``generate``) holds the session cookie and verify
    mode."""
    reply = await ctx.call(RESOURCES, "/seed_session", nemo_responses.run_row(b.row), b)
    return b.next(
        "generate", cookies=b.with_cookies(RESOURCES, reply.cookies), verify_mode=verify_mode_of(reply.headers)
    )
