"""From the sandbox's reply to ``proof_status``, reward and the feedback a correction turn needs (REFERENCE B.3).

Everything here is a pure function of the compiled code and the compiler output, so a
verification run again (``replay``) gives the same answer byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_ERRORS = 8
MAX_RAW_OUTPUT = 2000
CONTEXT_LINES = 2

#: The default correction prompt: the problem, the failed attempt and what Lean said.
DEFAULT_REFINEMENT_TEMPLATE = """\
Your previous Lean 4 proof attempt did not pass verification.

Problem:
```lean4
{problem}
```

Previous attempt:
```lean4
{attempt}
```

Verifier feedback:
{error_feedback}

Think about what went wrong and how to fix it, then write a corrected proof. Your final answer \
must be a single, complete Lean 4 markdown code block containing the whole theorem. Do NOT include \
any text or explanation after the code block. Begin with ```lean4 and end with ```."""

TEMPLATE_FIELDS = ("problem", "attempt", "error_feedback")

_ENTRY = re.compile(r"^(?P<file>\S+?\.lean):(?P<line>\d+):(?P<col>\d+): (?P<kind>error|warning|info)\b:? ?(?P<msg>.*)$")


@dataclass(frozen=True)
class Verdict:
    proof_status: str
    reward: float
    needs_correction: bool


@dataclass(frozen=True)
class LeanMessage:
    line: int
    column: int
    kind: str
    text: str


def proof_status(compiler_output: Mapping[str, Any]) -> str:
    """``timeout``, the sandbox's non-``completed`` status, ``has_sorry``, or ``completed``."""
    status = str(compiler_output.get("process_status") or "sandbox_error")
    if status == "timeout":
        return "timeout"
    if status != "completed":
        return status
    if "sorry" in _text(compiler_output):
        return "has_sorry"
    return "completed"


def verdict(status: str) -> Verdict:
    if status == "completed":
        return Verdict(status, 1.0, False)
    return Verdict(status, 0.0, True)


def _text(compiler_output: Mapping[str, Any]) -> str:
    stdout = compiler_output.get("stdout") or ""
    stderr = compiler_output.get("stderr") or ""
    return "\n".join(part for part in (str(stdout), str(stderr)) if part)


def parse_messages(output: str) -> list[LeanMessage]:
    """``<file>.lean:line:col: error: ...`` entries; a message runs until the next entry."""
    messages: list[LeanMessage] = []
    current: dict[str, Any] | None = None
    for raw in output.splitlines():
        match = _ENTRY.match(raw)
        if match:
            if current is not None:
                messages.append(LeanMessage(**current))
            current = {
                "line": int(match.group("line")),
                "column": int(match.group("col")),
                "kind": match.group("kind"),
                "text": match.group("msg"),
            }
        elif current is not None:
            current["text"] += "\n" + raw
    if current is not None:
        messages.append(LeanMessage(**current))
    return [LeanMessage(m.line, m.column, m.kind, m.text.rstrip()) for m in messages]


def _context(code_lines: list[str], line: int, column: int) -> str:
    """The lines around an error, the error's own line marked from its column on."""
    if not 1 <= line <= len(code_lines):
        return ""
    width = len(str(min(len(code_lines), line + CONTEXT_LINES)))
    out = []
    for number in range(max(1, line - CONTEXT_LINES), min(len(code_lines), line + CONTEXT_LINES) + 1):
        text = code_lines[number - 1]
        if number == line:
            col = min(max(column, 0), len(text))
            text = f"{text[:col]}<error>{text[col:]}</error>"
        out.append(f"{'>' if number == line else ' '} {number:>{width}} | {text}")
    return "\n".join(out)


def _raw(output: str) -> str:
    if len(output) > MAX_RAW_OUTPUT:
        output = output[:MAX_RAW_OUTPUT] + "\n... (output truncated)"
    return f"Compilation output:\n{output}\n"


def error_feedback(status: str, compiler_output: Mapping[str, Any] | None, code: str, timeout_s: float) -> str | None:
    """What the model is told about a failed attempt; ``None`` when the proof passed."""
    if status == "completed":
        return None
    if status == "empty_generation":
        return "The response contained no text, so there was no proof to check. Write a complete Lean 4 proof."
    output = _text(compiler_output or {})
    if status == "timeout":
        return (
            f"Compilation did not finish within {timeout_s:g} seconds (timeout). The proof may loop or rely on "
            "tactics that are too expensive; try a more direct proof."
        )
    if status == "sandbox_error":
        return f"The Lean sandbox could not check the proof: {output or 'no details'}"
    lead = "The proof is incomplete: it uses `sorry`.\n" if status == "has_sorry" else ""
    errors = [m for m in parse_messages(output) if m.kind == "error"]
    if not errors:
        return lead + _raw(output)
    code_lines = code.splitlines()
    shown = errors[:MAX_ERRORS]
    parts = [f"Lean reported {len(errors)} error{'s' if len(errors) != 1 else ''}"
             + (f" (showing the first {MAX_ERRORS})" if len(errors) > MAX_ERRORS else "") + ":"]
    for index, message in enumerate(shown, 1):
        block = f"\nError {index} at line {message.line}, column {message.column}:\n{message.text}"
        context = _context(code_lines, message.line, message.column)
        if context:
            block += f"\nCode:\n{context}"
        parts.append(block)
    return lead + "\n".join(parts) + "\n"


def problem_text(header: str, informal_prefix: str | None, formal_statement: str) -> str:
    statement = formal_statement.rstrip()
    return f"{header}{informal_prefix or ''}{statement}\n  sorry"


def correction_prompt(template: str, *, problem: str, attempt: str, error_feedback: str) -> str:
    return template.format(problem=problem, attempt=attempt, error_feedback=error_feedback.rstrip())


def check_template(template: str) -> None:
    """Raise ValueError unless ``template`` formats with exactly the known fields."""
    try:
        template.format(**{name: "" for name in TEMPLATE_FIELDS})
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
        raise ValueError(f"refinement_prompt_template may use only {fields}: {exc}") from None
