"""math_formal_lean conformance cases: verifications of the example tasks with perturbed predictions,
every kind of answer a Lean sandbox gives, server configurations, and invalid bodies.

Shared by ``test_lean_conformance.py`` and ``benchmarks/conformance_blackjack_lean.py``. A sequence is
``{config, sandbox, calls}``: server config overrides (applied to both servers), the sandbox's
scripted answers in order (see ``oracle/glue_math_formal_lean.py``: ``{"status", "json"}``,
``{"status", "raw"}``, ``{"raise": "timeout" | "connect"}``) and the HTTP calls.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.conformance.blackjack_cases import function_call, message, output_text, reasoning, response

DATA = Path(__file__).resolve().parents[2] / "services" / "gym_services" / "resources" / "math_formal_lean" / "data"
FILE = "/lean4/my_project/tmpab12cd34.lean"


def example_tasks() -> list[dict[str, Any]]:
    """The reference's example tasks (our copy of ``data/example.jsonl``) and a few miniF2F rows."""
    rows = [json.loads(line) for line in (DATA / "example.jsonl").read_text().splitlines() if line.strip()]
    minif2f = [json.loads(line) for line in (DATA / "minif2f_test.jsonl").read_text().splitlines() if line.strip()]
    return rows + minif2f[:: max(1, len(minif2f) // 15)][:15]


# --- predictions ------------------------------------------------------------------------------

TACTICS = [
    "  nlinarith [sq_nonneg (a - b), sq_nonneg (a + b)]",
    "  norm_num",
    "  intro h\n  omega",
    "  have h₃ : 1 = 1 := by rfl\n  simp_all\n  linarith",
    "  sorry",
    "  decide",
    "  constructor\n  · norm_num\n  · linarith",
    "",
]


def statement_line(task: dict[str, Any]) -> str:
    return task["formal_statement"].rstrip()


def generation(task: dict[str, Any], rng: random.Random) -> str:
    """A model answer for ``task``: plan text, the theorem restated or not, in one of many code-block forms."""
    tactic = rng.choice(TACTICS)
    statement = statement_line(task)
    shape = rng.randrange(12)
    if shape == 0:  # the whole theorem, `:= by` at the end of the statement
        code = f"{task['header']}{statement}\n{tactic}"
    elif shape == 1:  # `by` alone on the next line
        code = statement.removesuffix(" by").rstrip() + "\n  by\n" + tactic
    elif shape == 2:  # a term proof on the same line
        code = statement.removesuffix(" by").rstrip() + " by simp"
    elif shape == 3:  # tactics only
        code = tactic
    elif shape == 4:  # `theorem` renamed to `lemma` (not a theorem header for the reference)
        code = statement.replace("theorem ", "lemma ", 1) + "\n" + tactic
    elif shape == 5:  # an indented theorem, with a doc comment
        code = "/-- doc -/\n  " + statement + "\n" + tactic
    elif shape == 6:  # no := at all
        code = "theorem foo : True\n" + tactic
    elif shape == 7:  # `by` then tactics on the same line
        code = statement.removesuffix(" by").rstrip() + " := by norm_num\n  simp"
    elif shape == 8:  # an `example`
        code = "example : 1 + 1 = 2 := by\n  norm_num"
    else:
        code = f"{statement}\n{tactic}"
    fence = rng.choice(["```lean4\n", "```lean\n", "```lean3\n", "```\n", "```lean4 ", "```Lean4\n", "```python\n", ""])
    closing = "" if not fence else rng.choice(["\n```", "\n```\n", "```", "\n```  \n", ""])
    block = f"{fence}{code}{closing}" if fence else code
    before = rng.choice(
        [
            "",
            "Here is the proof plan.\n\n",
            "**Lean 4 Code:**\n",
            "Plan: use nlinarith.\n```lean4\nfirst attempt\n```\n",
        ]
    )
    after = rng.choice(["", "\n\nThis completes the proof.", "\n```lean4\n  norm_num\n```", "\n\nFINAL ANSWER: done"])
    text = before + block + after
    if rng.random() < 0.05:
        text = rng.choice(["", "   \n  ", "no code here", "```", "``````"])
    return text


def response_for(text: str, rng: random.Random) -> dict[str, Any]:
    shape = rng.randrange(7)
    if shape == 0:
        output = [reasoning("<think>plan</think>"), message(output_text(text))]
    elif shape == 1 and text:
        cut = rng.randrange(len(text) + 1)
        output = [message(output_text(text[:cut]), output_text(text[cut:]))]
    elif shape == 2 and text:
        cut = rng.randrange(len(text) + 1)
        output = [message(output_text(text[:cut])), function_call(), message(output_text(text[cut:]), index=1)]
    elif shape == 3:
        output = [message({"type": "refusal", "refusal": "```lean4\nsorry\n```"}, output_text(text))]
    else:
        output = [message(output_text(text))]
    extra = rng.choice(
        [
            {},
            {
                "usage": {
                    "input_tokens": 10,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 5,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 15,
                }
            },
            {"temperature": 0.6, "top_p": 0.95},
        ]
    )
    return response(output, **extra)


# --- what a sandbox answers ----------------------------------------------------------------------


def _error(line: int, col: int, text: str) -> str:
    return f"{FILE}:{line}:{col}: error: {text}"


def sandbox_answer(rng: random.Random) -> dict[str, Any]:
    """One of the answers a NeMo Skills Lean sandbox (or a broken one) gives."""
    kind = rng.randrange(16)
    line, col = rng.randrange(0, 30), rng.randrange(0, 12)

    def ok(status: str, stdout: str = "", stderr: str = "") -> dict[str, Any]:
        return {"status": 200, "json": {"process_status": status, "stdout": stdout, "stderr": stderr}}

    if kind == 0:
        return ok("completed")
    if kind == 1:
        return ok(
            "completed", f"{FILE}:{line}:{col}: warning: unused variable `h₀`\nnote: this linter can be disabled\n"
        )
    if kind == 2:
        return ok("completed", f"{FILE}:{line}:{col}: warning: declaration uses 'sorry'\n")
    if kind == 3:
        return ok("completed", "lemma sorry_free_lemma proved\n", "Sorry-free")
    if kind == 4:  # errors on stdout, as the real sandbox reports them
        return ok("failed", _error(line, col, "unknown identifier 'k'") + "\n")
    if kind == 5:  # errors on stderr: structured feedback with code context
        errors = "\n".join(
            _error(rng.randrange(1, 25), rng.randrange(0, 40), f"unsolved goals\nx : ℝ\n⊢ x = {i}")
            for i in range(rng.randrange(1, 12))
        )
        return ok("failed", "", errors + "\n")
    if kind == 6:
        return ok("failed", "", "")
    if kind == 7:
        return ok("failed", "x" * rng.randrange(1900, 2100), "tail")
    if kind == 8:
        return ok("timeout", "", "Timed out")
    if kind == 9:
        return ok("error", "", "lake: command failed")
    if kind == 10:
        return {"status": 502, "raw": "Bad Gateway"}
    if kind == 11:
        return {"raise": "timeout"}
    if kind == 12:
        return {"raise": "connect"}
    if kind == 13:
        return {"status": 200, "raw": "<html>not json</html>"}
    if kind == 14:  # extra fields in the reply
        return {"status": 200, "json": {"process_status": "completed", "stdout": "", "stderr": "", "elapsed": 1.5}}
    return ok("failed", "", f"{FILE}:{line}:{col}: error: type mismatch\n" + _error(1000, 0, "out of bounds"))


#: answers whose handling is unusual, each exercised once per run
SPECIAL_ANSWERS = [
    {"status": 500, "json": {"detail": "sandbox crashed"}},  # a JSON error body is taken as the compiler output
    {"status": 200, "json": {"process_status": "completed"}},  # no stdout/stderr
    {"status": 200, "json": {"process_status": "completed", "stdout": None, "stderr": ""}},
    {"status": 200, "json": ["completed"]},
    {"status": 200, "json": {"process_status": "weird", "stdout": "", "stderr": ""}},
    {"status": 404, "raw": "Not Found"},
    {"status": 200, "raw": ""},
]

CONFIGS: list[dict[str, Any]] = [
    {},
    {"extract_code_mode": "first"},
    {"restate_formal_statement": False},
    {"strip_theorem_from_proof": False},
    {"refinement_prompt_template": "FIX:\n{proof_attempt}\n--\n{error_message}"},
    {"compilation_timeout": 7.5, "max_output_characters": 50},
]


def verify_body(task: dict[str, Any], resp: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"responses_create_params": task["responses_create_params"], "response": resp}
    for key in ("header", "formal_statement", "informal_prefix", "name", "split"):
        if key in task and (key in ("header", "formal_statement") or rng.random() < 0.8):
            body[key] = task[key]
    if rng.random() < 0.5:
        body["turn_index"] = rng.randrange(0, 4)
    if rng.random() < 0.2:
        body["agent_ref"] = {"type": "responses_api_agents", "name": "math_formal_lean_simple_agent"}
    if rng.random() < 0.2:
        body["_ng_rollout_id"] = "rollout-7"
    if rng.random() < 0.2:
        body["responses_create_params"] = {
            **task["responses_create_params"],
            "temperature": 0.6,
            "max_output_tokens": 2048,
            "metadata": {"k": "v"},
        }
    return body


def verification_sequences(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` verifications: a task, a perturbed prediction, a config and a sandbox answer."""
    rng = random.Random(seed)
    tasks = example_tasks()
    out = []
    for index in range(count):
        task = tasks[index % len(tasks)]
        config = CONFIGS[0] if rng.random() < 0.6 else rng.choice(CONFIGS)
        text = generation(task, rng)
        body = verify_body(task, response_for(text, rng), rng)
        out.append({"config": config, "sandbox": [sandbox_answer(rng)], "calls": [{"path": "/verify", "json": body}]})
    return out


def sandbox_answer_sequences() -> list[dict[str, Any]]:
    """Every scripted answer kind, on every example task, plus the unusual ones."""
    rng = random.Random(7)
    tasks = example_tasks()[:5]
    out = []
    answers = [sandbox_answer(random.Random(k * 31 + 1)) for k in range(48)] + SPECIAL_ANSWERS
    for index, answer in enumerate(answers):
        task = tasks[index % len(tasks)]
        text = f"```lean4\n{task['header']}{task['formal_statement']}  nlinarith\n```"
        body = verify_body(task, response([message(output_text(text))]), rng)
        out.append({"config": {}, "sandbox": [answer], "calls": [{"path": "/verify", "json": body}]})
    return out


def recorded_sequences(reference: Path) -> list[dict[str, Any]]:
    """The reference's recorded verifications (``data/example_rollouts.jsonl``), each with its recorded compiler
    output."""
    tasks = {t["name"]: t for t in example_tasks()}
    out = []
    for line in (reference / "resources_servers/math_formal_lean/data/example_rollouts.jsonl").read_text().splitlines():
        recorded = json.loads(line)
        name = next(n for n in tasks if f"theorem {n} " in recorded["predicted_proof"])
        task = tasks[name]
        body = {
            **{k: task[k] for k in ("header", "formal_statement", "informal_prefix", "name")},
            "responses_create_params": recorded["responses_create_params"],
            "response": recorded["response"],
        }
        out.append(
            {
                "config": {},
                "sandbox": [{"status": 200, "json": recorded["compiler_output"]}],
                "calls": [{"path": "/verify", "json": body}],
            }
        )
    return out


# --- other routes and bodies the reference refuses -----------------------------------------------

J = "application/json"


def invalid_sequences() -> list[dict[str, Any]]:
    task = example_tasks()[0]
    good = {
        "responses_create_params": task["responses_create_params"],
        "header": task["header"],
        "formal_statement": task["formal_statement"],
        "response": response([message(output_text("```lean4\n  norm_num\n```"))]),
    }
    raw = lambda path, text, ctype=J: {"path": path, "raw": text, "content_type": ctype}  # noqa: E731
    without = lambda *keys: {k: v for k, v in good.items() if k not in keys}  # noqa: E731
    calls = [
        raw("/verify", "", None),
        raw("/verify", ""),
        raw("/verify", "{"),
        raw("/verify", json.dumps(good), "text/plain"),
        {"path": "/verify", "json": []},
        {"path": "/verify", "json": None},
        {"path": "/verify", "json": {}},
        {"path": "/verify", "json": without("header")},
        {"path": "/verify", "json": without("formal_statement")},
        {"path": "/verify", "json": without("response")},
        {"path": "/verify", "json": without("responses_create_params")},
        {"path": "/verify", "json": {**good, "header": 5}},
        {"path": "/verify", "json": {**good, "formal_statement": None}},
        {"path": "/verify", "json": {**good, "turn_index": "x"}},
        {"path": "/verify", "json": {**good, "turn_index": -1}},
        {"path": "/verify", "json": {**good, "turn_index": 2.0}},
        {"path": "/verify", "json": {**good, "turn_index": True}},
        {"path": "/verify", "json": {**good, "name": 7}},
        {"path": "/verify", "json": {**good, "informal_prefix": ["x"]}},
        {"path": "/verify", "json": {**good, "response": {}}},
        {"path": "/verify", "json": {**good, "response": {**good["response"], "output": [{"type": "bogus"}]}}},
        {"path": "/verify", "json": {**good, "responses_create_params": {"input": [], "bogus": 1}}},
        {"path": "/verify", "json": {**good, "reward": 5, "proof_status": "forged", "mask_sample": True}},
        {
            "path": "/verify",
            "json": {
                **good,
                "response": {
                    **good["response"],
                    "output": [{"type": "message", "role": "assistant", "content": "```lean4\n  norm_num\n```"}],
                },
            },
        },
        raw("/seed_session", "", None),
        raw("/seed_session", "{"),
        {"path": "/seed_session", "json": {}},
        {"path": "/seed_session", "json": task},
        {"path": "/seed_session", "json": []},
        {
            "path": "/seed_session",
            "json": {"resources_session_id": "s1", "episode_id": "e1", "task_id": "t1", "task_data": {}},
        },
        {
            "path": "/seed_session",
            "json": {
                "resources_session_id": "s1",
                "episode_id": {"rollout_id": "r1"},
                "task_id": {"taskset": "lean:test", "task_id": "t1"},
                "task_data": {},
            },
        },
        {
            "path": "/seed_session",
            "json": {
                "resources_session_id": "s1",
                "episode_id": {"rollout_id": "r1-a2"},
                "task_id": {"taskset": "lean:test", "task_id": "t1"},
                "task_data": {},
            },
        },
        {"path": "/close_session", "json": {"resources_session_id": "s1", "episode_id": "e1"}},
        {
            "path": "/close_session",
            "json": {"resources_session_id": "s1", "episode_id": {"rollout_id": "r1", "attempt": 2}},
        },
        {"path": "/close_session", "json": {"resources_session_id": "s1", "episode_id": {"rollout_id": "-bad"}}},
        {"path": "/close_session", "json": {}},
        {"method": "GET", "path": "/reverify_mode"},
        {"method": "GET", "path": "/verify"},
        {"path": "/no_such_route", "json": {}},
        {"method": "PUT", "path": "/close_session", "json": {}},
        {"method": "POST", "path": "/reverify_mode", "json": {}},
        *({"method": "GET", "path": p} for p in ("/", "/health", "/healthz", "/livez", "/readyz")),
        {"method": "DELETE", "path": "/livez"},
    ]
    ok = {"status": 200, "json": {"process_status": "completed", "stdout": "", "stderr": ""}}
    return [{"config": {}, "sandbox": [ok], "calls": [call]} for call in calls]
