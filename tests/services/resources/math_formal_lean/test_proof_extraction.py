"""Proof extraction, code building, status mapping, error feedback and the correction prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_services.resources.math_formal_lean import feedback, proof
from gym_services.resources.math_formal_lean.app import Config

DATA = Path(__file__).resolve().parents[4] / "services/gym_services/resources/math_formal_lean/data"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = "theorem t1 (n : ℕ) (h₀ : n ≤ 9) : n < 10 := by\n"


def message(text: str) -> dict:
    return {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}


# --- output text ----------------------------------------------------------------------


def test_output_text_joins_message_parts_and_skips_reasoning() -> None:
    response = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "```lean4\nnot this\n```"}]},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "part one "},
                {"type": "refusal", "refusal": "ignored"},
                {"type": "output_text", "text": "part two"},
            ]},
            {"type": "function_call", "name": "x", "arguments": "{}"},
        ]
    }
    assert proof.output_text(response) == "part one part two"
    assert proof.output_text({"output_text": "direct"}) == "direct"
    assert proof.output_text(None) == "" and proof.output_text({}) == ""


# --- code fences ----------------------------------------------------------------------

TWO_BLOCKS = "plan\n```lean4\nfirst\n```\nmore\n```lean4\nsecond\n```\n"


def test_last_block_by_default_and_first_on_request() -> None:
    assert proof.extract_code(TWO_BLOCKS) == "second\n"
    assert proof.extract_code(TWO_BLOCKS, "first") == "first\n"


def test_lean_blocks_win_over_other_languages() -> None:
    text = "```lean\nthe proof\n```\nand a check:\n```python\nprint(1)\n```"
    assert proof.extract_code(text) == "the proof\n"
    assert proof.extract_code("```\nuntagged\n```") == "untagged\n"
    assert proof.extract_code("```lean3\nold\n```") == "old\n"


def test_unterminated_fence_and_no_fence() -> None:
    assert proof.extract_code("text\n```lean4\ncut off mid-proof\n  nlinarith") == "cut off mid-proof\n  nlinarith"
    assert proof.extract_code("  simp\n  omega") == "  simp\n  omega"


# --- proof body -----------------------------------------------------------------------


def build(code: str) -> str:
    return proof.build_code(HEADER, STATEMENT, code)


def test_theorem_header_is_replaced_by_the_task_statement() -> None:
    code = "import Mathlib\n/-- doc -/\ntheorem t1 (n : ℕ) (h : n ≤ 9) : n < 100 := by\n  omega\n"
    assert build(code) == HEADER + STATEMENT + "  omega"


def test_same_line_by_and_term_proofs() -> None:
    assert build("theorem t1 (n : ℕ) : n < 10 := by simp\n  omega") == HEADER + STATEMENT + "  simp\n  omega"
    assert build("theorem t1 (n : ℕ) : n < 10 :=\n  foo\n    bar") == HEADER + STATEMENT + "  exact foo\n      bar"


def test_named_theorem_is_found_among_lemmas_and_nested_assignments() -> None:
    code = (
        "lemma helper (x : ℕ := 3) : x = x := by rfl\n"
        "theorem t1 (n : ℕ) (h₀ : n ≤ 9) : n < 10 := by\n"
        "  have h : n ≤ 9 := h₀\n  omega\n"
        "theorem other : True := by trivial\n"
    )
    assert build(code) == HEADER + STATEMENT + "  have h : n ≤ 9 := h₀\n  omega"


def test_block_without_declaration_is_a_tactic_proof() -> None:
    assert build("norm_num\nomega") == HEADER + STATEMENT + "  norm_num\n  omega"
    assert build("  norm_num\n  omega\n") == HEADER + STATEMENT + "  norm_num\n  omega"


def test_flags_keep_the_models_code() -> None:
    code = "theorem t1 : 1 = 1 := by rfl"
    assert proof.build_code(HEADER, STATEMENT, code, restate_formal_statement=False) == HEADER + code
    kept = proof.build_code(HEADER, STATEMENT, "  rfl\n", strip_theorem_from_proof=False)
    assert kept == HEADER + STATEMENT + "  rfl"


def test_recorded_rollouts_rebuild_their_predicted_proof_exactly() -> None:
    rows = [json.loads(line) for line in (DATA / "multi_turn_success_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        prompt = proof.extract_code(row["responses_create_params"]["input"][0]["content"])
        header = prompt[: prompt.index("/--")]
        start = prompt.index("theorem")
        statement = prompt[start : prompt.index(":= by", start) + len(":= by")] + "\n"
        built = proof.build_code(header, statement, proof.extract_code(proof.output_text(row["response"])))
        assert built == row["predicted_proof"]


# --- status, feedback, prompt -----------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "status"),
    [
        ({"process_status": "completed", "stdout": "", "stderr": ""}, "completed"),
        ({"process_status": "completed", "stdout": "x.lean:1:0: warning: declaration uses 'sorry'"}, "has_sorry"),
        ({"process_status": "completed", "stdout": "", "stderr": "sorry"}, "has_sorry"),
        ({"process_status": "failed", "stdout": "sorry"}, "failed"),
        ({"process_status": "timeout", "stdout": ""}, "timeout"),
        ({"process_status": "sandbox_error", "stderr": "Sandbox 502 error"}, "sandbox_error"),
    ],
)
def test_proof_status(output: dict, status: str) -> None:
    assert feedback.proof_status(output) == status
    assert feedback.verdict(status).reward == (1.0 if status == "completed" else 0.0)
    assert feedback.verdict(status).needs_correction is (status != "completed")


def test_error_feedback_marks_errors_in_context_and_caps_at_eight() -> None:
    code = "\n".join(f"line {i}" for i in range(1, 21))
    stdout = "".join(f"/lean4/my_project/tmp.lean:{i}:5: error: problem {i}\n  detail {i}\n" for i in range(1, 11))
    stdout += "/lean4/my_project/tmp.lean:2:0: warning: unused variable\n"
    text = feedback.error_feedback("failed", {"process_status": "failed", "stdout": stdout}, code, 30)
    assert text.startswith("Lean reported 10 errors (showing the first 8):")
    assert "Error 8 at line 8, column 5:\nproblem 8\n  detail 8" in text and "Error 9" not in text
    assert "> 3 | line <error>3</error>" in text.replace("  ", " ")
    assert "unused variable" not in text


def test_error_feedback_raw_output_timeout_and_sandbox_error() -> None:
    raw = "x" * 2500
    text = feedback.error_feedback("failed", {"process_status": "failed", "stdout": raw}, "code", 30)
    assert text.startswith("Compilation output:\n" + "x" * 2000) and "x" * 2001 not in text
    assert "30 seconds" in feedback.error_feedback("timeout", {"process_status": "timeout"}, "code", 30)
    sandbox = feedback.error_feedback("sandbox_error", {"stderr": "Sandbox 500 error"}, "code", 30)
    assert "Sandbox 500 error" in sandbox
    assert feedback.error_feedback("completed", {}, "code", 30) is None


def test_correction_prompt_embeds_problem_attempt_and_error() -> None:
    prompt = feedback.correction_prompt(
        feedback.DEFAULT_REFINEMENT_TEMPLATE,
        problem=feedback.problem_text(HEADER, "/-- informal -/\n", STATEMENT),
        attempt=HEADER + STATEMENT + "  nlinarith",
        error_feedback="Lean reported 1 error:\n...\n",
    )
    assert "```lean4\n" + HEADER + "/-- informal -/\n" + STATEMENT.rstrip() + "\n  sorry\n```" in prompt
    assert "Previous attempt:\n```lean4\n" + HEADER + STATEMENT + "  nlinarith\n```" in prompt
    assert "Verifier feedback:\nLean reported 1 error:\n...\n\n" in prompt
    assert prompt.rstrip().endswith("Begin with ```lean4 and end with ```.")


def test_template_is_checked_when_the_config_loads() -> None:
    with pytest.raises(ValueError, match="refinement_prompt_template"):
        Config(name="lean", refinement_prompt_template="fix {proof}")
    custom = Config(name="lean", refinement_prompt_template="P={problem} A={attempt} E={error_feedback}")
    assert custom.refinement_prompt_template.startswith("P=")
