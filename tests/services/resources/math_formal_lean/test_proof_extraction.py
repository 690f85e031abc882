"""Proof extraction, code building, status mapping, error feedback and the correction prompt.

The rules are NeMo Gym's (``tests/conformance/test_lean_conformance.py`` compares them with the
reference byte for byte); these tests pin them down one by one, readable without the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_services.base.nemo_responses import ResponseObject, UnreadableOutput
from gym_services.resources.math_formal_lean import feedback, proof
from gym_services.resources.math_formal_lean.app import Config

DATA = Path(__file__).resolve().parents[4] / "services/gym_services/resources/math_formal_lean/data"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = "theorem t1 (n : ℕ) (h₀ : n ≤ 9) : n < 10 := by\n"


def response(*items: dict) -> ResponseObject:
    return ResponseObject.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": list(items),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


# --- output text ----------------------------------------------------------------------


def test_output_text_joins_message_parts_and_skips_reasoning() -> None:
    reasoning = {
        "id": "rs",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "```lean4\nnot this\n```"}],
    }
    message = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [text_part("part one "), {"type": "refusal", "refusal": "ignored"}, text_part("part two")],
    }
    call = {"type": "function_call", "call_id": "c", "name": "x", "arguments": "{}"}
    assert response(reasoning, message, call).output_text() == "part one part two"
    assert response().output_text() == ""


def test_output_text_of_a_string_message_fails_as_the_sdk_does() -> None:
    with pytest.raises(UnreadableOutput, match="'str' object has no attribute 'type'"):
        response({"type": "message", "role": "assistant", "content": "```lean4\n  simp\n```"}).output_text()
    assert response({"type": "message", "role": "assistant", "content": ""}).output_text() == ""


# --- code blocks ----------------------------------------------------------------------

TWO_BLOCKS = "plan\n```lean4\nfirst\n```\nmore\n```lean4\nsecond\n```\n"


def test_last_block_by_default_and_first_on_request() -> None:
    assert proof.clean_generation(TWO_BLOCKS) == "second"
    assert proof.clean_generation(TWO_BLOCKS, "first") == "first"


def test_fence_tags_are_tried_in_order() -> None:
    text = "```python\nprint(1)\n```\n```lean\nthe proof\n```"
    assert proof.clean_generation(text) == "the proof"  # a lean block wins over a later untagged one
    assert proof.clean_generation("```\nuntagged\n```") == "untagged"
    assert proof.clean_generation("```lean3\nold\n```") == "old"
    assert proof.clean_generation("```Lean4\nx\n```") == "Lean4\nx"  # case matters: only the any-fence matches
    assert proof.clean_generation("```lean4\nfirst\n``` and ```lean\nsecond\n```") == "first"


def test_no_block_or_an_empty_one_takes_the_answer_without_outer_fences() -> None:
    assert (
        proof.clean_generation("text\n```lean4\ncut off mid-proof\n  nlinarith")
        == "text\n```lean4\ncut off mid-proof\n  nlinarith"
    )
    assert proof.clean_generation("```lean4\n  nlinarith") == "nlinarith"
    assert proof.clean_generation("  simp  ") == "simp"
    assert proof.clean_generation("```lean4\n```") == ""


# --- the proof after the theorem ---------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("theorem t1 : n < 10 := by\n  omega", "  omega"),
        ("theorem t1 : n < 10 := by omega\n  simp", "omega\n  simp"),
        ("theorem t1 : n < 10 :=\n  by\n  omega", "  omega"),
        ("theorem t1 : n < 10 := foo n", "foo n"),
        ("  theorem t1 :\n    n < 10 := by\n  omega", "  omega"),
        ("lemma t1 : n < 10 := by\n  omega", "lemma t1 : n < 10 := by\n  omega"),  # only theorem/example
        ("example : 1 = 1 := by\n  rfl", "  rfl"),
        ("theorem t1 : True\n  trivial", "theorem t1 : True\n  trivial"),  # no := at all
        ("  omega", "omega"),
        ("", ""),
    ],
)
def test_proof_only(code: str, expected: str) -> None:
    assert proof.proof_only(code) == expected


def test_build_code_and_its_flags() -> None:
    text = f"```lean4\n{HEADER}{STATEMENT}  omega\n```"
    assert proof.build_code(text, HEADER, STATEMENT) == HEADER + STATEMENT + "  omega"
    kept = proof.build_code(text, HEADER, STATEMENT, strip_theorem_from_proof=False)
    assert kept == HEADER + STATEMENT + (HEADER + STATEMENT + "  omega").strip()
    assert proof.build_code(text, HEADER, STATEMENT, restate_formal_statement=False) == HEADER + "  omega"
    assert proof.build_code("plain", "", STATEMENT) == STATEMENT + "plain"


def test_recorded_rollouts_rebuild_their_predicted_proof_exactly() -> None:
    rows = [json.loads(line) for line in (DATA / "multi_turn_success_examples.jsonl").read_text().splitlines()]
    tasks = {t["name"]: t for t in map(json.loads, (DATA / "minif2f_test.jsonl").read_text().splitlines())}
    assert len(rows) == 2
    for row in rows:
        name = next(n for n in tasks if f"theorem {n} " in row["predicted_proof"])
        generation = response(*row["response"]["output"]).output_text()
        built = proof.build_code(generation, tasks[name]["header"], tasks[name]["formal_statement"])
        assert built == row["predicted_proof"]


# --- status, feedback, prompt -----------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "status"),
    [
        ({"process_status": "completed", "stdout": "", "stderr": ""}, "completed"),
        ({"process_status": "completed", "stdout": "x.lean:1:0: warning: declaration uses 'sorry'"}, "has_sorry"),
        ({"process_status": "completed", "stdout": "", "stderr": "Sorry."}, "has_sorry"),
        ({"process_status": "completed", "stdout": "sorry_free lemma", "stderr": ""}, "completed"),  # a word, not sorry
        ({"process_status": "failed", "stdout": "sorry"}, "failed"),
        ({"process_status": "timeout", "stdout": ""}, "timeout"),
        ({"process_status": "error", "stderr": "Sandbox 502 error"}, "error"),
        ({"stdout": ""}, "unknown"),
    ],
)
def test_proof_status(output: dict, status: str) -> None:
    assert feedback.proof_status(output) == status


def test_proof_status_fails_on_output_that_is_not_text() -> None:
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'lower'"):
        feedback.proof_status({"process_status": "completed", "stdout": None})


CODE = HEADER + STATEMENT + "  omega\n  simp"
ERR = "/lean4/my_project/tmp1.lean"


def test_error_feedback_marks_errors_in_context_and_caps_at_eight() -> None:
    one = feedback.error_feedback(
        {"process_status": "failed", "stdout": "", "stderr": f"{ERR}:9:2: error: omega failed\nmore"}, CODE
    )
    assert one == (
        "\nError 1:\n\nCorresponding Code:\n```lean4\n\nopen BigOperators Real Nat Topology Rat\n"
        "\ntheorem t1 (n : ℕ) (h₀ : n ≤ 9) : n < 10 := by\n  <error>omega</error>\n  simp\n\n```\n\nError Message: "
        "omega failed\nmore\n"
    )
    many = "\n".join(f"{ERR}:9:{c}: error: e{c}" for c in range(10))
    text = feedback.error_feedback({"process_status": "failed", "stdout": "", "stderr": many}, CODE)
    assert text.count("Error Message:") == 8 and text.endswith("\n... [Omitted 2 more errors] ...\n")
    outside = feedback.error_feedback(
        {"process_status": "failed", "stdout": "", "stderr": f"{ERR}:99:0: error: far"}, CODE
    )
    assert outside == ""  # errors outside the code are skipped


def test_error_feedback_raw_output_timeout_and_nothing() -> None:
    stdout = f"{ERR}:9:2: error: on stdout\n"  # the real sandbox reports errors on stdout: shown raw
    assert feedback.error_feedback({"process_status": "failed", "stdout": stdout, "stderr": ""}, CODE) == (
        f"Compilation output:\n{stdout}\n"
    )
    long = feedback.error_feedback({"process_status": "failed", "stdout": "x" * 3000, "stderr": ""}, CODE)
    assert long == "Compilation output:\n" + "x" * 2000 + "\n... [Truncated]"
    assert (
        feedback.error_feedback({"process_status": "timeout", "stdout": "", "stderr": ""}, CODE)
        == feedback.TIMEOUT_FEEDBACK
    )
    assert (
        feedback.error_feedback({"process_status": "failed", "stdout": "", "stderr": " "}, CODE)
        == feedback.NO_MESSAGE_FEEDBACK
    )


def test_correction_prompt_and_template_check() -> None:
    prompt = feedback.correction_prompt(None, proof_attempt="ATTEMPT", error_message="ERRORS")
    assert prompt.startswith("Here is a proof attempt for the following theorem in Lean4.\n\nATTEMPT\n\n")
    assert "compilation error message:\n\nERRORS\n\nYour task is to fix this proof." in prompt
    assert feedback.correction_prompt("{error_message}|{proof_attempt}", proof_attempt="a", error_message="e") == "e|a"
    Config(name="lean", refinement_prompt_template="{error_message} then {proof_attempt}")
    with pytest.raises(ValueError, match="may use only"):
        Config(name="lean", refinement_prompt_template="{problem}")
