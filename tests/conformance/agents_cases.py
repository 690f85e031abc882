"""Scenarios for the agent conformance suite: scripted model outputs and scripted environment answers.

Each case is plain JSON (it crosses into the oracle process): the agent kind, the agent config, the
``/run`` row, the model's responses in order, the environment's answers per path and the cookies the
model sets. The same case drives NeMo Gym's reference agent (``oracle/glue_agents.py``) and ours
(``agents_compare.run_ours``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conformance.scripted import environment_items, model_turns, recorded_script, response_object, usage_object

MODEL_COOKIES = {"model_route": "replica-1"}


def msg(text: str, n: int = 0) -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(name: str, arguments: str, n: int = 0) -> dict[str, Any]:
    return {
        "id": f"fc_{n}",
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def reasoning(text: str, n: int = 0) -> dict[str, Any]:
    return {"id": f"rs_{n}", "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def resp(
    items: list[dict[str, Any]], n: int = 0, *, usage: tuple[int, int] | None = (10, 5), incomplete: str | None = None
) -> dict[str, Any]:
    return response_object(
        items,
        response_id=f"resp_{n}",
        usage=usage_object(*usage) if usage else None,
        incomplete_details={"reason": incomplete} if incomplete else None,
    )


TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        "strict": False,
    },
    {"type": "function", "name": "store", "parameters": {"type": "object", "properties": {}}, "strict": True},
]


def rcp(input_: Any, **params: Any) -> dict[str, Any]:
    return {"input": input_, **params}


def seed(cookies: dict[str, str] | None = None) -> dict[str, Any]:
    return {"body": {}, "cookies": cookies or {}}


def verify(reward: float, **extra: Any) -> dict[str, Any]:
    return {"echo": {"reward": reward, **extra}}


def tool(text: str, status: int = 200, cookies: dict[str, str] | None = None) -> dict[str, Any]:
    return {"text": text, "status": status, "cookies": cookies or {}}


def case(name: str, kind: str, row: dict, script: list, env: dict, config: dict | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "config": config or {},
        "row": row,
        "script": script,
        "env": env,
        "model_cookies": MODEL_COOKIES,
    }


# --- simple_agent --------------------------------------------------------------------------

LIST_INPUT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Find the value of alpha, then store it."},
]


def simple_cases() -> list[dict[str, Any]]:
    k = "simple_agent"
    return [
        case(
            "no tool call",
            k,
            {"responses_create_params": rcp("What is 2+2?")},
            [resp([msg("4")])],
            {"/seed_session": [seed()], "/verify": [verify(1.0)]},
        ),
        case(
            "one tool call, list input, params",
            k,
            {
                "responses_create_params": rcp(
                    LIST_INPUT,
                    tools=TOOLS,
                    temperature=0.2,
                    max_output_tokens=512,
                    instructions="Use the tools.",
                    parallel_tool_calls=False,
                ),
                "ground_truth": [{"name": "lookup", "arguments": '{"key": "alpha"}'}],
                "category": "x",
            },
            [resp([call("lookup", '{"key": "alpha"}')], 0), resp([msg("alpha is 7", 1)], 1, usage=(30, 4))],
            {
                "/seed_session": [seed({"resources_session": "s-1"})],
                "/lookup": [tool('{"output":"7"}')],
                "/verify": [verify(1.0, matched=True)],
            },
        ),
        case(
            "parallel calls after reasoning, two rounds, cookies",
            k,
            {"responses_create_params": rcp(LIST_INPUT, tools=TOOLS), "_ng_task_index": 3, "_ng_rollout_index": 1},
            [
                resp(
                    [
                        reasoning("look both up", 0),
                        call("lookup", '{"key": "a"}', 0),
                        call("lookup", '{"key": "b"}', 1),
                    ],
                    0,
                ),
                resp([call("store", "{}", 2)], 1),
                resp([msg("done", 2)], 2),
            ],
            {
                "/seed_session": [seed({"resources_session": "s-2"})],
                "/lookup": [tool('{"output":"1"}', cookies={"resources_session": "s-2b"}), tool('{"output":"2"}')],
                "/store": [tool('{"output":null}')],
                "/verify": [verify(0.5)],
            },
        ),
        case(
            "invalid JSON arguments",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("lookup", '{"key": ', 0)], 0), resp([call("lookup", "", 1)], 1), resp([msg("sorry", 2)], 2)],
            {"/seed_session": [seed()], "/verify": [verify(0.0)]},
        ),
        case(
            "non-object arguments",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("lookup", "[1, 2]", 0), call("lookup", '"alpha"', 1)], 0), resp([msg("ok", 1)], 1)],
            {
                "/seed_session": [seed()],
                "/lookup": [tool('{"output":1}'), tool('{"output":2}')],
                "/verify": [verify(0.0)],
            },
        ),
        case(
            "tool answers 422 and 500",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("lookup", '{"key": 1}', 0)], 0), resp([call("store", "{}", 1)], 1), resp([msg("ok", 2)], 2)],
            {
                "/seed_session": [seed()],
                "/lookup": [tool('{"detail":[{"type":"string_type","loc":["body","key"]}]}', status=422)],
                "/store": [tool("Internal Server Error", status=500)],
                "/verify": [verify(0.0)],
            },
        ),
        case(
            "unknown tool",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("no_such_tool", "{}", 0)], 0), resp([msg("ok", 1)], 1)],
            {
                "/seed_session": [seed()],
                "/no_such_tool": [tool('{"detail":"Not Found"}', status=404)],
                "/verify": [verify(0.0)],
            },
        ),
        case(
            "tool names with a slash and with a space",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("ns/lookup", "{}", 0), call("bad name", "{}", 1)], 0), resp([msg("ok", 1)], 1)],
            {
                "/seed_session": [seed()],
                "/ns/lookup": [tool('{"output":"ns"}')],
                "/bad name": [tool('{"output":"space"}')],
                "/verify": [verify(0.0)],
            },
        ),
        case(
            "identity in the row, skip verification",
            k,
            {"responses_create_params": rcp("hi"), "_ng_rollout_id": "custom-rollout-7", "task": {"id": 7}},
            [resp([msg("hello")])],
            {"/seed_session": [seed()]},
            config={"skip_verification": True, "skip_verification_reward": 0.25},
        ),
        case(
            "max_steps reached",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("lookup", '{"key": "a"}', 0)], 0), resp([call("lookup", '{"key": "b"}', 1)], 1)],
            {
                "/seed_session": [seed()],
                "/lookup": [tool('{"output":1}'), tool('{"output":2}')],
                "/verify": [verify(0.0)],
            },
            config={"max_steps": 2},
        ),
        case(
            "incomplete response with a call",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("lookup", '{"key": "a"}', 0)], 0, incomplete="max_output_tokens")],
            {"/seed_session": [seed()], "/verify": [verify(0.0)]},
        ),
        case(
            "reasoning only",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([reasoning("hmm", 0)], 0)],
            {"/seed_session": [seed()], "/verify": [verify(0.0)]},
        ),
        case(
            "empty output",
            k,
            {"responses_create_params": rcp("go")},
            [resp([], 0, usage=None)],
            {"/seed_session": [seed()], "/verify": [verify(0.0)]},
        ),
        case(
            "usage missing on one turn",
            k,
            {"responses_create_params": rcp("go", tools=TOOLS)},
            [resp([call("store", "{}", 0)], 0, usage=None), resp([msg("ok", 1)], 1, usage=(40, 2))],
            {"/seed_session": [seed()], "/store": [tool('{"output":"ok"}')], "/verify": [verify(1.0)]},
        ),
        case(
            "model named in the task",
            k,
            {"responses_create_params": rcp("hi", model="task-model", top_p=0.9)},
            [resp([msg("hello")])],
            {"/seed_session": [seed()], "/verify": [verify(1.0)]},
        ),
    ]


# --- proof_refinement_agent ------------------------------------------------------------------

PROOF_INPUT = [{"role": "user", "content": "Complete the following Lean 4 proof: theorem t : 1 + 1 = 2 := by"}]


def failed(prompt: str | None, **extra: Any) -> dict[str, Any]:
    fields = {"proof_status": "failed", "needs_correction": True, "error_feedback": "error: x", **extra}
    if prompt is not None:
        fields["correction_prompt"] = prompt
    return verify(0.0, **fields)


def proved() -> dict[str, Any]:
    return verify(1.0, proof_status="success", needs_correction=False)


def proof_cases() -> list[dict[str, Any]]:
    k = "proof_refinement_agent"
    params = {"temperature": 0.6, "top_p": 0.95, "max_output_tokens": 2048}
    return [
        case(
            "proved on the first turn",
            k,
            {"responses_create_params": rcp(PROOF_INPUT, **params), "name": "t1"},
            [resp([reasoning("plan", 0), msg("```lean\nnorm_num\n```", 0)], 0)],
            {"/seed_session": [seed({"lean": "c1"})], "/verify": [proved()]},
            config={"max_correction_turns": 2},
        ),
        case(
            "two corrections then proved",
            k,
            {"responses_create_params": rcp(PROOF_INPUT, **params), "name": "t2"},
            [resp([msg("try 1", 0)], 0), resp([msg("try 2", 1)], 1, usage=(50, 9)), resp([msg("try 3", 2)], 2)],
            {"/seed_session": [seed()], "/verify": [failed("Fix error 1"), failed("Fix error 2"), proved()]},
            config={"max_correction_turns": 2},
        ),
        case(
            "corrections exhausted",
            k,
            {"responses_create_params": rcp("prove it", model="prover", temperature=1.0)},
            [resp([msg("a", 0)], 0), resp([msg("b", 1)], 1)],
            {"/seed_session": [seed()], "/verify": [failed("again"), failed("again")]},
            config={"max_correction_turns": 1},
        ),
        case(
            "needs correction without a prompt",
            k,
            {"responses_create_params": rcp(PROOF_INPUT)},
            [resp([msg("a", 0)], 0)],
            {"/seed_session": [seed()], "/verify": [failed(None)]},
            config={"max_correction_turns": 3},
        ),
        case(
            "single turn, attempts left out",
            k,
            {"responses_create_params": rcp(PROOF_INPUT)},
            [resp([msg("a", 0)], 0)],
            {"/seed_session": [seed()], "/verify": [failed("again")]},
            config={"max_correction_turns": 0, "include_all_attempts": False},
        ),
    ]


# --- gymnasium_agent -------------------------------------------------------------------------


def reset(observation: str | None, **info: Any) -> dict[str, Any]:
    return {"body": {"observation": observation, "info": info}, "cookies": {"env_session": "e-1"}}


def step(
    observation: str | None = None, reward: float = 0.0, terminated: bool = False, truncated: bool = False, **info: Any
) -> dict[str, Any]:
    return {
        "body": {
            "observation": observation,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }
    }


def gym_cases() -> list[dict[str, Any]]:
    k = "gymnasium_agent"
    act = "<action>hit</action>"
    return [
        case(
            "terminates on the first step",
            k,
            {"responses_create_params": rcp([{"role": "user", "content": "Play."}])},
            [resp([msg(act, 0)], 0)],
            {"/reset": [reset("Your hand: 10")], "/step": [step(None, 1.0, True, result="win")]},
        ),
        case(
            "observations and tool outputs",
            k,
            {
                "responses_create_params": rcp([{"role": "system", "content": "Game."}], tools=TOOLS, temperature=0.0),
                "_ng_task_index": 0,
                "_ng_rollout_index": 2,
            },
            [resp([msg(act, 0)], 0), resp([call("lookup", "{}", 1)], 1), resp([msg("<action>stand</action>", 2)], 2)],
            {
                "/reset": [reset("Your hand: 12")],
                "/step": [
                    step("Your hand: 15", 0.0),
                    step("Tool done", 0.25, tool_outputs=[{"call_id": "call_1", "output": '{"v": 1}'}]),
                    step(None, -1.0, True, result="lose"),
                ],
            },
        ),
        case(
            "runs out of steps",
            k,
            {"responses_create_params": rcp("Play.")},
            [resp([msg(act, 0)], 0), resp([msg(act, 1)], 1)],
            {"/reset": [reset(None)], "/step": [step("again", 0.5), step("again", 0.5)]},
            config={"max_steps": 2},
        ),
        case(
            "truncated by the environment",
            k,
            {"responses_create_params": rcp("Play.")},
            [resp([msg(act, 0)], 0)],
            {"/reset": [reset("start")], "/step": [step("stop", 0.0, False, True)]},
        ),
        case(
            "explicit close",
            k,
            {"responses_create_params": rcp("Play.")},
            [resp([msg(act, 0)], 0)],
            {
                "/reset": [reset("start", supports_explicit_close=True)],
                "/step": [step(None, 1.0, True)],
                "/close": [{"body": {}}],
            },
        ),
        case(
            "step idempotency",
            k,
            {"responses_create_params": rcp("Play.")},
            [resp([msg(act, 0)], 0), resp([msg(act, 1)], 1)],
            {
                "/reset": [reset("start", supports_step_idempotency=True)],
                "/step": [step("more"), step(None, 1.0, True)],
            },
        ),
    ]


# --- NeMo Gym's recorded rollouts as scenarios ------------------------------------------------

RECORDED = {
    "workplace_assistant": "simple_agent",
    "indirect_prompt_injection": "simple_agent",
    "blackjack": "gymnasium_agent",
    "math_formal_lean": "proof_refinement_agent",
}
RECORD_FIELDS = ("response", "reward")


def recorded_rows(reference: Path, environment: str) -> list[dict[str, Any]]:
    path = reference / "resources_servers" / environment / "data" / "example_rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded_case(environment: str, index: int, rec: dict[str, Any]) -> dict[str, Any]:
    """A recorded rollout: its model turns scripted, the environment answering what it answered then."""
    kind = RECORDED[environment]
    output = rec["response"]["output"]
    row = {k: v for k, v in rec.items() if k not in RECORD_FIELDS}
    script = recorded_script(rec["response"])
    extra = {
        k: rec[k]
        for k in ("injection_followed", "matched_tool", "matched_args", "proof_status", "predicted_proof")
        if k in rec
    }
    config: dict[str, Any] = {}
    if kind == "simple_agent":
        names = {i["call_id"]: i["name"] for i in output if i.get("type") == "function_call"}
        env: dict[str, list] = {"/seed_session": [seed()], "/verify": [verify(rec["reward"], **extra)]}
        for item in environment_items(output):
            env.setdefault(f"/{names[item['call_id']]}", []).append(tool(item["output"]))
    elif kind == "gymnasium_agent":
        observations = [i["content"] for i in environment_items(output)]
        steps = [step(obs) for obs in observations]
        steps.append(
            step(
                None, rec["reward"], rec.get("terminated", True), rec.get("truncated", False), **(rec.get("info") or {})
            )
        )
        env = {"/reset": [reset(None)], "/step": steps[: len(model_turns(output))]}
        config = {"max_steps": max(10, len(steps))}
    else:
        env = {"/seed_session": [seed()], "/verify": [verify(rec["reward"], needs_correction=False, **extra)]}
        config = {"max_correction_turns": 0}
    return case(f"recorded {environment} {index}", kind, row, script, env, config)


def recorded_cases(reference: Path) -> list[dict[str, Any]]:
    return [
        recorded_case(environment, i, rec)
        for environment in RECORDED
        for i, rec in enumerate(recorded_rows(reference, environment))
    ]


def invalid_row_cases() -> list[dict[str, Any]]:
    """Rows NeMo Gym's agents refuse (422, nothing called): each agent, each way of being malformed."""
    bad_rows = {
        "no create params": {"ground_truth": 1},
        "create params null": {"responses_create_params": None},
        "create params a list": {"responses_create_params": []},
        "create params without input": {"responses_create_params": {"temperature": 0.1}},
        "create params unknown field": {"responses_create_params": rcp("hi", bogus=1)},
        "create params streaming": {"responses_create_params": rcp("hi", stream=True)},
        "create params temperature text": {"responses_create_params": rcp("hi", temperature="hot")},
        "create params reasoning effort wrong": {"responses_create_params": rcp("hi", reasoning={"effort": "max"})},
        "input item of unknown type": {"responses_create_params": rcp([{"type": "bogus"}])},
        "tool without name": {"responses_create_params": rcp("hi", tools=[{"type": "function"}])},
        "rollout id a number": {"responses_create_params": rcp("hi"), "_ng_rollout_id": 5},
    }
    env = {"/seed_session": [seed()], "/verify": [verify(1.0)], "/reset": [{"body": {"observation": "o", "info": {}}}]}
    return [
        case(f"{name}", kind, row, [resp([msg("x")])], env)
        for kind in ("simple_agent", "proof_refinement_agent", "gymnasium_agent")
        for name, row in bad_rows.items()
    ]


def all_cases(reference: Path | None = None) -> list[dict[str, Any]]:
    recorded = recorded_cases(reference) if reference is not None else []
    return [*simple_cases(), *proof_cases(), *gym_cases(), *recorded]
