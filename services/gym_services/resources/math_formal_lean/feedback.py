"""From the sandbox's answer to ``proof_status``, the reward and the feedback a correction turn needs.

The rules and texts are NeMo Gym's ``math_formal_lean`` (0.7.0), which the model sees and training
records, so they are the same to the byte:

- ``proof_status``: ``timeout``; any other non-``completed`` process status as it is; ``has_sorry``
  when the word ``sorry`` appears in stdout or stderr (any case); else ``completed`` (reward 1).
- feedback: a timeout message; else the Lean errors found in *stderr* (``/lean4/my_project/...:L:C:
  error: ...``), at most 8, each with four lines of code before it, the marked span and one line
  after (errors on lines outside the compiled file are skipped, keeping their numbers); else the raw
  output (stdout, a newline, stderr; cut at 2000 characters); else a fixed sentence.
- the correction prompt: ``refinement_prompt_template`` (default: NeMo Gym's Nemotron refinement
  prompt) formatted with ``proof_attempt`` (the model's raw answer) and ``error_message``.

Pure functions of the compiled code and the compiler output, so a verification run again
(``replay``) gives the same answer byte for byte. Where the reference fails on a malformed sandbox
answer (a missing or non-text field), these functions fail the same way, and ``/verify`` answers
``500`` with the error, as NeMo Gym's server does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger(__name__)

MAX_ERRORS = 8
MAX_RAW_OUTPUT = 2000
CONTEXT_BEFORE = 4
SPAN_LINES = 6

TIMEOUT_FEEDBACK = "The compilation timed out. Please simplify your proof or use more efficient tactics."
NO_MESSAGE_FEEDBACK = "The proof failed but no specific error message was captured."
EMPTY_GENERATION_FEEDBACK = "Empty generation received. Please provide a valid Lean 4 proof."
EMPTY_ATTEMPT = "(empty)"

#: NeMo Gym's default (Nemotron single-turn) refinement prompt; fields {proof_attempt}, {error_message}
DEFAULT_REFINEMENT_TEMPLATE = (
    "Here is a proof attempt for the following theorem in Lean4.\n\n{proof_attempt}\n\n"
    "The proof is not correct. Following is the compilation error message:\n\n{error_message}\n\n"
    "Your task is to fix this proof. Before producing the Lean 4 code to formally prove the given theorem, "
    "do a detailed analysis of the error message. Your final answer must be a single, complete Lean 4 "
    "markdown code block containing the completed theorem. Do NOT include any text or explanation before "
    "or after the code block. Begin with ```lean4 and end with ```."
)
TEMPLATE_FIELDS = ("proof_attempt", "error_message")

_SORRY = re.compile(r"\bsorry\b")
_ERROR_ENTRY = re.compile(r"(/lean4/my_project/.*?:\d+:\d+: error:.*?)(?=\n/lean4/my_project|\Z)", re.DOTALL)
_POSITION = re.compile(r":(\d+):(\d+):")


@dataclass(frozen=True)
class LeanError:
    line: int
    column: int
    end: tuple[int, int] | None
    text: str


def proof_status(compiler_output: Mapping[str, Any]) -> Any:
    """``timeout``, the sandbox's other status, ``has_sorry`` or ``completed``."""
    status = compiler_output.get("process_status", "unknown")
    if status == "timeout":
        return "timeout"
    if status != "completed":
        return status
    said = compiler_output.get("stdout", "").lower() + "\n" + compiler_output.get("stderr", "").lower()
    return "has_sorry" if _SORRY.search(said) else "completed"


def parse_errors(log: str) -> list[LeanError]:
    """The Lean errors of a compiler log; an error's text runs to the next file location."""
    found = []
    for entry in _ERROR_ENTRY.findall(log):
        position = _POSITION.search(entry)
        if position:
            text = entry.split("error:")[1].strip() if "error:" in entry else entry
            found.append(LeanError(int(position.group(1)), int(position.group(2)), None, text))
    return found


def _marked(lines: list[str], error: LeanError) -> str | None:
    """The code around one error with its span marked, or None when its line is not in the code."""
    start, column = error.line - 1, error.column
    if not 0 <= start < len(lines):
        LOG.warning("Lean error on line %d is outside the %d compiled lines", start, len(lines))
        return None
    if error.end is None:
        end, end_column = start, len(lines[start])
    else:
        end, end_column = error.end[0] - 1, error.end[1]
    out = [lines[start + k] + "\n" for k in range(-CONTEXT_BEFORE, 0) if 0 <= start + k < len(lines)]
    if start != end:
        out.append(lines[start][:column] + "<error>" + lines[start][column:] + "\n")
        out += [lines[j] + "\n" for j in range(start + 1, min(end, start + SPAN_LINES)) if j < len(lines)]
        if end > start + SPAN_LINES:
            out.append("... --[Truncated]-- ...\n")
        if end < len(lines):
            out.append(lines[end][:end_column] + "</error>" + lines[end][end_column:] + "\n")
    else:
        text = lines[start]
        out.append(text[:column] + "<error>" + text[column:end_column] + "</error>" + text[end_column:] + "\n")
    if end + 1 < len(lines):
        out.append(lines[end + 1] + "\n")
    return "".join(out)


def errors_text(code: str, errors: list[LeanError]) -> str:
    """Each error (at most 8) with the code it points at."""
    if not errors:
        return ""
    lines = code.split("\n")
    out = []
    for number, error in enumerate(errors[:MAX_ERRORS], 1):
        marked = _marked(lines, error)
        if marked is None:
            continue
        out.append(
            f"\nError {number}:\n\nCorresponding Code:\n```lean4\n{marked}\n```\n\nError Message: {error.text}\n"
        )
    if len(errors) > MAX_ERRORS:
        out.append(f"\n... [Omitted {len(errors) - MAX_ERRORS} more errors] ...\n")
    return "".join(out)


def error_feedback(compiler_output: Mapping[str, Any], code: str) -> str:
    """What the model is told about a failed compilation."""
    status = compiler_output.get("process_status", "unknown")
    stdout = compiler_output.get("stdout", "")
    stderr = compiler_output.get("stderr", "")
    if status == "timeout":
        return TIMEOUT_FEEDBACK
    errors = parse_errors(stderr)
    if errors:
        return errors_text(code, errors)
    combined = stdout + "\n" + stderr
    if combined.strip():
        if len(combined) > MAX_RAW_OUTPUT:
            combined = combined[:MAX_RAW_OUTPUT] + "\n... [Truncated]"
        return f"Compilation output:\n{combined}"
    return NO_MESSAGE_FEEDBACK


def correction_prompt(template: str | None, *, proof_attempt: str, error_message: str) -> str:
    return (template or DEFAULT_REFINEMENT_TEMPLATE).format(proof_attempt=proof_attempt, error_message=error_message)


def check_template(template: str) -> None:
    """Raise ValueError unless ``template`` formats with the known fields only."""
    try:
        template.format(**{name: "" for name in TEMPLATE_FIELDS})
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
        raise ValueError(f"refinement_prompt_template may use only {fields}: {exc!r}") from None
