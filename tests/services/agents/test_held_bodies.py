"""What an agent holds of a model call while the generation runs: the episode's call body is written at once and its
params are not kept; its ``/v1/responses`` proxy sends the policy model the caller's bytes as they are (checked, not
kept parsed), or a string ``input`` as one user message."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import weakref
from typing import Any

import httpx
import pytest
from tests.support.asgi import base_config, serve

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.context import StepContext
from gym_services.agents.common.downstream import Downstream, json_bytes
from gym_services.agents.common.loop import AgentLoop, StepKind
from gym_services.agents.common.records import EPISODE_ENCODER
from gym_services.agents.common.service import create_agent_app, forwarded_body
from gym_services.agents.common.steps import output_items
from gym_services.agents.common.tokens import EpisodeTokens
from gym_services.agents.simple_agent.app import Config as SimpleConfig
from gym_services.agents.simple_agent.loop import SimpleAgentLoop, SimpleBoundary
from gym_services.base import nemo_responses
from gym_services.base.config import load_config
from gym_services.base.errors import ApiError
from gym_services.base.identity import RolloutIdentity
from gym_services.base.tokens import FIELDS
from gym_services.control.participant import RestoredRecord, Scope


class Tracked(list):
    """A list whose lifetime a test can watch (a plain list cannot be weakly referenced)."""


class TrackedDict(dict):
    """A dict whose lifetime a test can watch."""


class HeldModel(httpx.AsyncBaseTransport):
    """Answers ``/v1/responses`` once released; keeps the request's bytes as they arrived."""

    def __init__(self) -> None:
        self.arrived, self.release = asyncio.Event(), asyncio.Event()
        self.content = b""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.content = await request.aread()
        self.arrived.set()
        await self.release.wait()
        return httpx.Response(200, json={"output": [], "usage": {}})


async def test_an_episode_does_not_hold_its_call_params_while_the_model_generates() -> None:
    model = HeldModel()
    async with httpx.AsyncClient(transport=model) as client:
        ctx = StepContext(RolloutIdentity(rollout_id="r"), Downstream("self", "http://self", client), {}, "own")
        schema = Tracked([{"type": "object"}])
        alive = weakref.ref(schema)
        params = {"model": "m", "input": [{"role": "user", "content": "hi"}], "tools": [{"parameters": schema}]}
        call = asyncio.create_task(ctx.generate(Boundary(name="generate", row={}), params))
        del params, schema
        await asyncio.wait_for(model.arrived.wait(), 5)
        gc.collect()
        assert alive() is None  # written at once; nothing keeps the params while the generation runs
        assert json.loads(model.content)["tools"] == [{"parameters": [{"type": "object"}]}]
        model.release.set()
        assert (await asyncio.wait_for(call, 5)).status == 200


def test_a_body_is_forwarded_as_the_bytes_the_caller_sent() -> None:
    raw = (
        b'{"model": "m",  "input": [{"role": "user", "content": "hi"}, {"type": "function_call_output",'
        b' "call_id": "c", "output": "1.50"}], "prompt_token_ids": [1, 2, 3], "temperature": 1.0e0}'
    )
    assert forwarded_body(raw) is raw  # not parsed and written again: the same object


def test_a_string_input_becomes_one_user_message() -> None:
    sent = forwarded_body(b'{"model": "m", "input": "hello"}')
    assert json.loads(sent) == {"model": "m", "input": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize("raw", [b"", b"  ", b"{}"])
def test_an_empty_body_is_an_empty_object(raw: bytes) -> None:
    assert forwarded_body(raw) == b"{}"


@pytest.mark.parametrize(("raw", "why"), [(b"[1, 2]", "must be a JSON object"), (b'{"input": ', "not valid JSON")])
def test_a_body_that_is_not_a_json_object_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ApiError, match=why) as refused:
        forwarded_body(raw)
    assert refused.value.status == 400


class Waiting(AgentLoop):
    """One step, then a step that waits to be released."""

    kind = "waiting"

    def __init__(self) -> None:
        self.waiting, self.release = asyncio.Event(), asyncio.Event()

    def initial(self, row: dict[str, Any]) -> Boundary:
        return Boundary(name="first", row=row)

    def step_kind(self, boundary: Boundary) -> StepKind:
        return StepKind.REPLAY

    async def advance(self, ctx: StepContext, boundary: Boundary) -> Boundary:
        if boundary.name == "first":
            return boundary.next("second")
        self.waiting.set()
        await self.release.wait()
        return boundary.finish({"reward": 1.0})


async def test_a_running_episode_does_not_hold_the_run_body_it_started_from() -> None:
    """``/run``'s body is let go once its episode starts: what the row holds is the boundaries' (shared by them, not
    copied), and nothing else keeps the body."""
    loop = Waiting()
    config = load_config(
        SimpleConfig, overrides=base_config("agent", model_url="http://model", resources_url="http://r")
    )
    app = create_agent_app(config, loop, {})
    async with serve(app):
        participant = app.state.held.participant
        tools = [{"type": "function", "name": "t"}]
        body = TrackedDict(responses_create_params={"input": [], "tools": tools})
        alive = weakref.ref(body)
        run = asyncio.create_task(participant.run(RolloutIdentity(rollout_id="r"), body))
        del body
        await asyncio.wait_for(loop.waiting.wait(), 5)
        gc.collect()
        assert alive() is None
        assert participant.episodes["r"].boundary.row["responses_create_params"]["tools"] is tools  # one copy
        loop.release.set()
        assert await asyncio.wait_for(run, 5) == {"reward": 1.0}


def test_the_next_boundary_shares_the_task_row_and_copies_the_rest() -> None:
    """No step changes the task row: the next boundary shares what it holds (its tools), and copies every other
    container, so a step that changes the new boundary's input or outputs leaves the one before as it was."""
    tools = [{"type": "function", "name": "t", "parameters": {"type": "object"}}]
    first = Boundary(
        name="generate",
        row={"responses_create_params": {"input": [], "tools": tools}, "extra": [1]},
        input=[{"role": "user", "content": "hi"}],
        outputs=[{"type": "message", "content": "a"}],
    )
    second = first.next("tool", outputs=[*first.outputs, {"type": "function_call", "name": "t"}])
    assert second.row == first.row
    assert second.row["responses_create_params"] is first.row["responses_create_params"]  # shared, not copied
    assert second.input == first.input and second.input is not first.input
    second.input[0]["content"] = "changed"
    second.outputs[0]["content"] = "changed"
    assert first.input == [{"role": "user", "content": "hi"}]
    assert first.outputs == [{"type": "message", "content": "a"}]
    assert (second.name, second.seq) == ("tool", 1)
    replaced = first.next("seed", row={"responses_create_params": {"input": []}})
    assert replaced.row == {"responses_create_params": {"input": []}}


class EchoingModel(httpx.AsyncBaseTransport):
    """Answers ``/v1/responses`` as the policy model does: a response that echoes the request's tools and instructions,
    parsed afresh by the caller (equal to the task's, not the same objects), or ``echo`` in their place."""

    def __init__(self, echo: dict[str, Any] | None = None) -> None:
        self.echo = echo

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = json.loads(await request.aread())
        echoed = self.echo or {k: sent[k] for k in ("tools", "instructions") if k in sent}
        message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}
        return httpx.Response(200, json={"id": "resp", "output": [message], "usage": {}, **echoed})


@pytest.mark.parametrize("echo", [None, {"tools": [{"type": "function", "name": "other"}], "instructions": "Other."}])
async def test_the_last_response_shares_the_tasks_tools_it_echoes(echo: dict[str, Any] | None) -> None:
    """A model's response echoes the task's tools and instructions: the boundary's last response holds the row's own
    objects where they are equal (not a second parsed copy beside the row), and what the episode answers is the
    same either way."""
    tools = [{"type": "function", "name": "t", "description": "long " * 50, "parameters": {"type": "object"}}]
    row = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}], "tools": tools}}
    row["responses_create_params"]["instructions"] = "Be brief."
    loop = SimpleAgentLoop(None)
    async with httpx.AsyncClient(transport=EchoingModel(echo)) as client:
        ctx = StepContext(RolloutIdentity(rollout_id="r"), Downstream("self", "http://self", client), {}, "own")
        after = await loop.advance(ctx, loop.initial(row).next("generate"))
    assert isinstance(after, SimpleBoundary) and after.last_response is not None
    given = row["responses_create_params"]
    if echo is None:
        assert after.last_response["tools"] is tools and after.last_response["instructions"] is given["instructions"]
    else:  # not the task's: left as the model answered
        assert after.last_response["tools"] == echo["tools"] and after.last_response["tools"] is not tools
    unshared = after.model_copy(update={"last_response": copy.deepcopy(after.last_response)})
    assert json_bytes(loop.final_response(after)) == json_bytes(loop.final_response(unshared))


TRAINING_OUTPUTS = [
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        "prompt_token_ids": list(range(300, 2300)),
        "generation_token_ids": [7, 8, 9],
        "generation_log_probs": [-0.5, -0.25, -1e-05],
    },
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "lookup",
        "arguments": '{"q": 1}',
        "prompt_token_ids": [1, 2, 3],
        "generation_token_ids": [4],
        "generation_log_probs": [-0.125],
        "unknown_extra": {"kept": True},
    },
]


@pytest.mark.parametrize("given", TRAINING_OUTPUTS)
def test_output_items_keep_the_episodes_arrays_and_write_what_nemo_gym_keeps(given: dict[str, Any]) -> None:
    """The given form of an output item whose token fields are the episode's arrays is, byte for byte, the given form
    of the same item with lists, and it holds the arrays themselves (no list of Python ints in between)."""
    tokens = EpisodeTokens()
    triple = tokens.add(*(given[name] for name in FIELDS))
    with_arrays = {**given, **dict(zip(FIELDS, triple.arrays(), strict=True))}
    (kept,) = output_items({"output": [with_arrays]})
    assert json_bytes(kept) == json_bytes(nemo_responses.item(given, full=False, output=True))
    assert all(kept[name] is array for name, array in zip(FIELDS, triple.arrays(), strict=True))


def _gauge(metrics: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + " "))


async def test_the_proxy_reports_the_model_calls_it_waits_on_and_their_bytes() -> None:
    """``gym_agent_model_calls_in_flight`` and ``gym_agent_model_call_bytes_in_flight``: what the agent holds of the
    model calls its proxy forwards, while the model generates; both back to 0 once it answered."""
    model = HeldModel()
    config = load_config(
        SimpleConfig, overrides=base_config("agent", model_url="http://model", resources_url="http://r")
    )
    app = create_agent_app(config, Waiting(), {}, transport=model)
    body = json.dumps({"model": "m", "input": [{"role": "user", "content": "hi " * 500}]}).encode()
    async with serve(app) as client:
        call = asyncio.create_task(client.post("/v1/responses", content=body))
        await asyncio.wait_for(model.arrived.wait(), 5)
        metrics = (await client.get("/metrics")).text
        assert _gauge(metrics, "gym_agent_model_calls_in_flight") == 1
        assert _gauge(metrics, "gym_agent_model_call_bytes_in_flight") == len(body) == len(model.content)
        model.release.set()
        assert (await asyncio.wait_for(call, 5)).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert _gauge(metrics, "gym_agent_model_calls_in_flight") == 0
        assert _gauge(metrics, "gym_agent_model_call_bytes_in_flight") == 0


@pytest.mark.parametrize("full", [True, False], ids=["full form", "given form"])
def test_a_response_and_a_calls_params_keep_the_episodes_arrays(full: bool) -> None:
    """The final response a verify call sends (``nemo_responses.response``) and a model call's params with the
    episode's earlier items as input (``nemo_responses.create_params``) are, byte for byte, those of the same values
    with lists, and hold the episode's arrays themselves: no list of Python ints per item (at 32k contexts, a verify
    body made them for every call's whole prompt)."""
    tokens = EpisodeTokens()
    arrays = [dict(zip(FIELDS, tokens.add(*(g[n] for n in FIELDS)).arrays(), strict=True)) for g in TRAINING_OUTPUTS]
    with_arrays = [{**given, **kept} for given, kept in zip(TRAINING_OUTPUTS, arrays, strict=True)]
    head = {"id": "r", "created_at": 1, "model": "m", "object": "response", "parallel_tool_calls": True}
    made = nemo_responses.response({**head, "output": with_arrays, "tool_choice": "auto", "tools": []}, full)
    listed = nemo_responses.response({**head, "output": TRAINING_OUTPUTS, "tool_choice": "auto", "tools": []}, full)
    assert json_bytes(made) == json_bytes(listed)
    assert all(made["output"][i][n] is kept[n] for i, kept in enumerate(arrays) for n in FIELDS)
    user = {"role": "user", "content": "hi"}
    made = nemo_responses.create_params({"model": "m", "input": [user, *with_arrays], "tools": []}, full)
    listed = nemo_responses.create_params({"model": "m", "input": [user, *TRAINING_OUTPUTS], "tools": []}, full)
    assert json_bytes(made) == json_bytes(listed)
    assert all(made["input"][1 + i][n] is kept[n] for i, kept in enumerate(arrays) for n in FIELDS)


class EchoingVerifier(httpx.AsyncBaseTransport):
    """A resources server's ``/verify`` as NeMo Gym's answer it: the body it was sent, with a reward; ``extra`` an
    output item of a call the episode never made, added to the echoed response."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = extra

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = json.loads(await request.aread())
        sent["response"]["output"].append(self.extra)
        return httpx.Response(200, json={**sent, "reward": 1.0})


async def test_a_verify_answer_holds_the_episodes_arrays_for_the_calls_it_echoes() -> None:
    """``/verify`` answers with the response it was sent, every call's prompt in it: parsed, lists of Python ints.
    The calls the episode made become its arrays as soon as the answer is read (no copy of them is made from the
    lists); a call it never made is left as the server wrote it, and the episode's table does not take it."""
    tokens = EpisodeTokens()
    arrays = [dict(zip(FIELDS, tokens.add(*(g[n] for n in FIELDS)).arrays(), strict=True)) for g in TRAINING_OUTPUTS]
    outputs = [{**given, **kept} for given, kept in zip(TRAINING_OUTPUTS, arrays, strict=True)]
    stranger = {**TRAINING_OUTPUTS[1], "prompt_token_ids": [9, 9, 9]}
    loop = SimpleAgentLoop(None)
    row = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}
    at_verify = loop.initial(row).next("verify", outputs=outputs, last_response={"id": "r", "output": []})
    async with httpx.AsyncClient(transport=EchoingVerifier(stranger)) as client:
        resources = Downstream("resources", "http://resources", client)
        ctx = StepContext(RolloutIdentity(rollout_id="r"), resources, {"resources": resources}, "own", tokens=tokens)
        done = await loop.advance(ctx, at_verify)
    assert done.result is not None and done.result["reward"] == 1.0
    echoed = done.result["response"]["output"]
    assert all(echoed[i][n] is kept[n] for i, kept in enumerate(arrays) for n in FIELDS)
    assert echoed[-1]["prompt_token_ids"] == [9, 9, 9] and isinstance(echoed[-1]["prompt_token_ids"], list)
    assert len(tokens) == len(arrays)


async def test_live_episodes_of_one_task_hold_one_copy_of_its_create_params() -> None:
    """Rollouts of one task run at once (a group per prompt), each ``/run`` body parsed on its own: their episodes
    hold one object for the equal create params (the first's), another task's its own, and once no episode holds
    them nothing is kept. Restored from a checkpoint, they share them again."""
    loop = Waiting()
    config = load_config(
        SimpleConfig, overrides=base_config("agent", model_url="http://model", resources_url="http://r")
    )
    app = create_agent_app(config, loop, {})
    task = {"responses_create_params": {"input": [{"role": "user", "content": "plan"}], "tools": [{"name": "t"}]}}
    other = {"responses_create_params": {"input": [{"role": "user", "content": "plan"}], "tools": [{"name": "u"}]}}
    async with serve(app):
        participant = app.state.held.participant
        rows = {"r1": task, "r2": task, "r3": other}
        runs = [
            asyncio.create_task(participant.run(RolloutIdentity(rollout_id=rid), json.loads(json.dumps(row))))
            for rid, row in rows.items()
        ]
        for _ in range(500):
            if len(participant.episodes) == 3 and all(
                e.boundary.name == "second" for e in participant.episodes.values()
            ):
                break
            await asyncio.sleep(0.01)
        params = {rid: participant.episodes[rid].boundary.row["responses_create_params"] for rid in rows}
        assert params["r1"] is params["r2"] and params["r3"] is not params["r1"]
        assert params["r1"] == task["responses_create_params"] and params["r3"] == other["responses_create_params"]
        assert len(participant.shared_params) == 2
        captured = (await participant.capture(Scope.of(None))).records
        records = [RestoredRecord(r.key, EPISODE_ENCODER.encode(r.state), r.rollout_id, r.attempt) for r in captured]
        del captured  # it holds the boundaries
        loop.release.set()
        assert await asyncio.wait_for(asyncio.gather(*runs), 5) == [{"reward": 1.0}] * 3
        del params
        gc.collect()
        assert len(participant.shared_params) == 0
    restoring = create_agent_app(config, Waiting(), {})
    async with serve(restoring):  # a fresh process restores the three: as one task and another again
        restored = await restoring.state.held.participant.validate(records)
        params = {rid: restored[rid].boundary.row["responses_create_params"] for rid in rows}
        assert params["r1"] is params["r2"] and params["r3"] is not params["r1"]
        assert params["r1"] == task["responses_create_params"] and params["r3"] == other["responses_create_params"]


async def test_the_agent_counts_each_token_it_holds_once() -> None:
    """``gym_agent_token_bytes{episodes="live"}``: a live episode's calls, each prompt the whole conversation so far,
    count 4 bytes per distinct id and per log-prob (what its table holds), however many times its prompts repeat
    them."""
    loop = Waiting()
    config = load_config(
        SimpleConfig, overrides=base_config("agent", model_url="http://model", resources_url="http://r")
    )
    app = create_agent_app(config, loop, {})
    row = {"responses_create_params": {"input": [{"role": "user", "content": "plan"}]}}
    async with serve(app):
        participant = app.state.held.participant
        run = asyncio.create_task(participant.run(RolloutIdentity(rollout_id="r1"), row))
        await asyncio.wait_for(loop.waiting.wait(), 5)
        assert participant.live_token_bytes() == 0
        context = list(range(1_000, 1_500))  # 500 ids of system prompt and tools
        for turn in range(3):  # each call: the context so far, 10 ids generated, then 90 ids of the next turn
            generated = list(range(2_000 + 10 * turn, 2_010 + 10 * turn))
            participant.episodes["r1"].tokens.add(list(context), generated, [-0.25] * 10)
            context += generated + list(range(3_000 + 90 * turn, 3_090 + 90 * turn))
        distinct = 500 + 2 * 90 + 3 * 10  # the last turn's 90 ids are in no prompt yet
        assert participant.live_token_bytes() == 4 * (distinct + 3 * 10)
        loop.release.set()
        assert await asyncio.wait_for(run, 5) == {"reward": 1.0}
