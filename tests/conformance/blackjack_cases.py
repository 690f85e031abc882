"""Blackjack conformance cases: seeded random games, every action form, invalid bodies.

Shared by ``test_blackjack_conformance.py`` (a few hundred games in CI) and
``benchmarks/conformance_blackjack_lean.py`` (as many as asked). Every game resets with a
``seed`` in the body: our server deals from ``random.Random(seed)``; the reference ignores the
field (its request model allows extra fields) and the oracle glue injects ``random.Random(seed)``
as the generator it creates, so both deal from the same generator.
"""

from __future__ import annotations

import random
from typing import Any

SYSTEM = (
    "You are playing Blackjack. After seeing your hand, respond with <action>hit</action> or "
    "<action>stand</action>. Think briefly, then give your action tag."
)
#: the reference's example task (``resources_servers/blackjack/data/example.jsonl``)
RCP: dict[str, Any] = {"input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Deal me in."}]}
MAX_STEPS = 8


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message(*parts: dict[str, Any], role: str = "assistant", index: int = 0) -> dict[str, Any]:
    return {"id": f"msg_{index}", "type": "message", "role": role, "status": "completed", "content": list(parts)}


def reasoning(text: str, index: int = 0) -> dict[str, Any]:
    return {"id": f"rs_{index}", "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def function_call(index: int = 0) -> dict[str, Any]:
    return {
        "id": f"fc_{index}",
        "type": "function_call",
        "call_id": f"call_{index}",
        "name": "hit",
        "arguments": "{}",
        "status": "completed",
    }


def response(output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A Responses API object as a model server returns it."""
    return {
        "id": "resp_1",
        "created_at": 1782184824.0,
        "model": "policy",
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
        **extra,
    }


def reset_call(seed: int, rcp: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"path": "/reset", "json": {"responses_create_params": rcp or RCP, "seed": seed}}


def step_call(resp: dict[str, Any], rcp: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"path": "/step", "json": {"responses_create_params": rcp or RCP, "response": resp}}


# --- what a model might answer ---------------------------------------------------------------

ACTION_TEXTS = [
    "<action>hit</action>",
    "<action>stand</action>",
    "I have a weak hand against the dealer, so I take another card. <action>hit</action>",
    "Standing is safer here. <action>stand</action>",
    "<action>  HIT  </action>",
    "<ACTION>Stand</ACTION>",
    "<action>\nhit\n</action>",
    "<action>stand</action> ... actually no: <action>hit</action>",  # the first tag counts
    "<action>hit</action> ... actually no: <action>stand</action>",
    "<action>fold</action>",  # not an action: stands
    "<action>double down</action> <action>hit</action>",
    "hit me",  # no tag: stands
    "<action>hit",
    "",
    "Think: hit or stand? <action>hit</action>\n",
    "<action>hit\ud800</action>",  # text that cannot be encoded as UTF-8
    "\ud800 <action>stand</action>",
]


def action_response(rng: random.Random) -> dict[str, Any]:
    """A random model answer: one of many texts in one of many output shapes."""
    text = rng.choice(ACTION_TEXTS)
    shape = rng.randrange(9)
    if shape == 0:  # the tag split across two output_text parts
        cut = rng.randrange(len(text) + 1)
        output = [message(output_text(text[:cut]), output_text(text[cut:]))]
    elif shape == 1:  # reasoning first; its text is not the answer
        output = [reasoning("<action>stand</action> is tempting"), message(output_text(text))]
    elif shape == 2:  # two assistant messages
        cut = rng.randrange(len(text) + 1)
        output = [message(output_text(text[:cut])), message(output_text(text[cut:]), index=1)]
    elif shape == 3:  # a function call beside the message
        output = [function_call(), message(output_text(text))]
    elif shape == 4:  # a refusal part next to the text
        output = [message({"type": "refusal", "refusal": "<action>hit</action>"}, output_text(text))]
    elif shape == 5:  # a message whose content is a plain string (an "easy" input message)
        output = [{"type": "message", "role": rng.choice(["assistant", "user"]), "content": text}]
    elif shape == 6:  # no output at all
        output = []
    else:
        output = [message(output_text(text))]
    return response(output)


def random_games(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` games: a seeded deal, then model answers until the game is over (at most MAX_STEPS)."""
    rng = random.Random(seed)
    games = []
    for _ in range(count):
        deal = rng.randrange(2**32)
        calls = [reset_call(deal)] + [step_call(action_response(rng)) for _ in range(MAX_STEPS)]
        games.append({"seeds": [deal], "until_over": True, "calls": calls})
    return games


def every_path_games() -> list[dict[str, Any]]:
    """Deals that reach each outcome through each action: stand-win/loss/draw, hit-continue, hit-bust."""
    hit, stand = (
        response([message(output_text("<action>hit</action>"))]),
        response([message(output_text("<action>stand</action>"))]),
    )
    games = []
    for deal in range(40):
        for plan in ([stand], [hit, stand], [hit, hit, stand], [hit, hit, hit, hit]):
            games.append(
                {"seeds": [deal], "until_over": True, "calls": [reset_call(deal)] + [step_call(r) for r in plan]}
            )
    return games


# --- bodies the reference refuses ---------------------------------------------------------------

J = "application/json"
_OK = response([message(output_text("<action>hit</action>"))])


def invalid_calls() -> list[tuple[str, dict[str, Any]]]:
    """``(name, call)``: malformed bodies and envelopes for /reset and /step."""
    raw = lambda path, text, ctype=J: {"path": path, "raw": text, "content_type": ctype}  # noqa: E731
    cases: list[tuple[str, dict[str, Any]]] = []
    for path in ("/reset", "/step"):
        cases += [
            (f"{path} empty", raw(path, "", None)),
            (f"{path} empty json", raw(path, "")),
            (f"{path} cut json", raw(path, "[1,")),
            (f"{path} trailing comma", raw(path, '{"a": 1,}')),
            (f"{path} bad escape", raw(path, '{"a": "\\x"}')),
            (f"{path} text/plain", raw(path, '{"responses_create_params": {"input": []}}', "text/plain")),
            (f"{path} no content type", raw(path, '{"responses_create_params": {"input": []}}', None)),
            (f"{path} array", {"path": path, "json": []}),
            (f"{path} null", {"path": path, "json": None}),
            (f"{path} string", {"path": path, "json": "x"}),
            (f"{path} number", {"path": path, "json": 5}),
            (f"{path} {{}}", {"path": path, "json": {}}),
            (f"{path} rcp null", {"path": path, "json": {"responses_create_params": None, "response": _OK}}),
            (f"{path} rcp string", {"path": path, "json": {"responses_create_params": "x", "response": _OK}}),
            (f"{path} rcp list", {"path": path, "json": {"responses_create_params": [], "response": _OK}}),
            (f"{path} rcp without input", {"path": path, "json": {"responses_create_params": {}, "response": _OK}}),
            (
                f"{path} rcp unknown field",
                {"path": path, "json": {"responses_create_params": {"input": [], "bogus": 1}, "response": _OK}},
            ),
            (
                f"{path} rcp bad temperature",
                {
                    "path": path,
                    "json": {"responses_create_params": {"input": [], "temperature": "hot"}, "response": _OK},
                },
            ),
            (
                f"{path} rcp bad max_output_tokens",
                {
                    "path": path,
                    "json": {"responses_create_params": {"input": [], "max_output_tokens": "x"}, "response": _OK},
                },
            ),
            (
                f"{path} rcp stream true",
                {"path": path, "json": {"responses_create_params": {"input": [], "stream": True}, "response": _OK}},
            ),
            (
                f"{path} rcp input string",
                {"path": path, "json": {"responses_create_params": {"input": "hi"}, "response": _OK}},
            ),
        ]
    bad_responses = {
        "response missing": None,
        "response null": {"response": None},
        "response string": {"response": "x"},
        "response list": {"response": []},
        "response {}": {"response": {}},
        "response output string": {"response": {**_OK, "output": "x"}},
        "response id number": {"response": {**_OK, "id": 5}},
        "response created_at text": {"response": {**_OK, "created_at": "noon"}},
        "response without model": {"response": {k: v for k, v in _OK.items() if k != "model"}},
        "response object wrong": {"response": {**_OK, "object": "chat.completion"}},
        "response item without type": {"response": {**_OK, "output": [{"text": "<action>hit</action>"}]}},
        "response item not an object": {"response": {**_OK, "output": ["<action>hit</action>"]}},
        "response message without id": {
            "response": {
                **_OK,
                "output": [{"type": "message", "role": "assistant", "content": [output_text("<action>hit</action>")]}],
            }
        },
        "response text without annotations": {
            "response": {
                **_OK,
                "output": [{**message(), "content": [{"type": "output_text", "text": "<action>hit</action>"}]}],
            }
        },
        "response unknown item type": {"response": {**_OK, "output": [{"type": "bogus"}]}},
        # deeper inside the items and the response's nested objects
        "response refusal without text": {
            "response": {**_OK, "output": [{**message(), "content": [{"type": "refusal"}]}]}
        },
        "response part of an input type": {
            "response": {
                **_OK,
                "output": [{**message(), "content": [{"type": "input_text", "text": "<action>hit</action>"}]}],
            }
        },
        "response part text number": {
            "response": {
                **_OK,
                "output": [{**message(), "content": [{"type": "output_text", "text": 5, "annotations": []}]}],
            }
        },
        "response parts mixed": {
            "response": {
                **_OK,
                "output": [
                    {
                        **message(),
                        "content": [
                            output_text("<action>hit</action>"),
                            {"type": "output_text"},
                            {"type": "refusal", "refusal": 1},
                        ],
                    }
                ],
            }
        },
        "response message status wrong": {
            "response": {**_OK, "output": [{**message(output_text("x")), "status": "done"}]}
        },
        "response message role wrong": {"response": {**_OK, "output": [{**message(output_text("x")), "role": "tool"}]}},
        "response call arguments object": {
            "response": {
                **_OK,
                "output": [{"type": "function_call", "name": "f", "arguments": {"a": 1}, "call_id": "c1"}],
            }
        },
        "response call without call_id": {
            "response": {**_OK, "output": [{"type": "function_call", "name": "f", "arguments": "{}"}]}
        },
        "response call status wrong": {
            "response": {
                **_OK,
                "output": [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1", "status": "ok"}],
            }
        },
        "response reasoning summary string": {
            "response": {**_OK, "output": [{"id": "rs_1", "type": "reasoning", "summary": "thinking"}]}
        },
        "response reasoning summary item wrong": {
            "response": {**_OK, "output": [{"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text"}]}]}
        },
        "response reasoning without id": {
            "response": {**_OK, "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}]}
        },
        "response function call output in output": {
            "response": {**_OK, "output": [{"type": "function_call_output", "call_id": "c1", "output": 5}]}
        },
        "response tools entry wrong": {"response": {**_OK, "tools": [{"type": "function"}]}},
        "response tool_choice wrong": {"response": {**_OK, "tool_choice": {"type": "function"}}},
        "response usage wrong": {"response": {**_OK, "usage": {"input_tokens": "x"}}},
        "response incomplete reason wrong": {"response": {**_OK, "incomplete_details": {"reason": "tired"}}},
        "response error wrong": {"response": {**_OK, "error": {"code": 5}}},
        "response status wrong": {"response": {**_OK, "status": "done"}},
        "response temperature text": {"response": {**_OK, "temperature": "hot"}},
        "rcp input item content number": {
            "responses_create_params": {"input": [{"type": "message", "role": "user", "content": 5}]},
            "response": _OK,
        },
        "rcp input item unknown type": {"responses_create_params": {"input": [{"type": "bogus"}]}, "response": _OK},
        "rcp input call without name": {
            "responses_create_params": {"input": [{"type": "function_call", "arguments": "{}", "call_id": "c"}]},
            "response": _OK,
        },
        "rcp tools entry wrong": {
            "responses_create_params": {"input": [], "tools": [{"type": "function"}]},
            "response": _OK,
        },
        "rcp reasoning effort wrong": {
            "responses_create_params": {"input": [], "reasoning": {"effort": "extreme"}},
            "response": _OK,
        },
    }
    for name, extra in bad_responses.items():
        body: dict[str, Any] = {"responses_create_params": RCP, **(extra or {})}
        cases.append((f"/step {name}", {"path": "/step", "json": body}))
    return cases


def route_calls() -> list[tuple[str, dict[str, Any]]]:
    """``(name, call)``: paths and methods the server has no route for, the framework's liveness routes."""
    return [
        ("GET /reset", {"method": "GET", "path": "/reset"}),
        ("PUT /step", {"method": "PUT", "path": "/step", "json": {}}),
        ("POST /seed_session", {"path": "/seed_session", "json": {}}),
        ("POST /verify", {"path": "/verify", "json": {}}),
        ("POST /close_session", {"path": "/close_session", "json": {}}),
        ("POST /close", {"path": "/close", "json": {}}),
        ("GET /no/such/path", {"method": "GET", "path": "/no/such/path"}),
        ("POST /reset/", {"path": "/reset/", "json": {}}),
        ("DELETE /", {"method": "DELETE", "path": "/"}),
        *((f"GET {p}", {"method": "GET", "path": p}) for p in ("/", "/health", "/healthz", "/livez", "/readyz")),
        ("POST /healthz", {"path": "/healthz", "json": {}}),
    ]


def invalid_sequences() -> list[tuple[str, dict[str, Any]]]:
    """Each invalid call after a seeded reset, then a valid step: a refused call must change nothing."""
    out = []
    for index, (name, call) in enumerate(invalid_calls()):
        deal, again = 1000 + 2 * index, 1001 + 2 * index
        if call["path"] == "/reset" and isinstance(call.get("json"), dict):
            call = {**call, "json": {**call["json"], "seed": again}}  # if it is accepted, it deals from this seed
        out.append((name, {"seeds": [deal, again], "calls": [reset_call(deal), call, step_call(_OK)]}))
    return out
