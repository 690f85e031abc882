"""From a model's answer to the Lean file the sandbox compiles (as NeMo Gym's ``math_formal_lean`` does; see the
README).

The rules are NeMo Gym's ``math_formal_lean`` (0.7.0), the specification this server answers to:

1. the answer's code is the last (``extract_code_mode: first``: the first) fenced block, trying the
   fence tags ``lean4``, ``lean3``, ``lean`` and then any fence, in that order, and stripped; when no
   block (or only an empty one) is found, the whole answer with a leading opening fence and a
   trailing closing fence removed;
2. with ``strip_theorem_from_proof``, only what follows the first ``:=`` at or after the first line
   starting with ``theorem`` or ``example`` is kept, without a leading ``by``; without such a line,
   or without ``:=``, the code is kept whole;
3. the file is the task's ``header``, its ``formal_statement`` (with ``restate_formal_statement``)
   and that proof, concatenated as they are.

So a model cannot prove a different statement than the one asked. Pure functions: ``/verify``
depends only on its request and the sandbox's answer.
"""

from __future__ import annotations

import re
from typing import Literal

ExtractMode = Literal["last", "first"]

#: the fence tags tried in order; "" is any fence (its tag, if any, becomes part of the code)
FENCE_TAGS = ("lean4", "lean3", "lean", "")
_BLOCKS = {tag: re.compile("```" + tag + r"\s*\n?(.*?)\n?```", re.DOTALL) for tag in FENCE_TAGS}
_OUTER_FENCES = re.compile(r"^\s*```(?:lean4|lean3|lean)?\s*|\s*```[\s]*$")
_DECLARATION = re.compile(r"^\s*(theorem|example)\b")


def code_block(text: str, mode: ExtractMode = "last") -> str:
    """The chosen fenced block of the first fence tag that has any, stripped; ``""`` when none does."""
    for tag in FENCE_TAGS:
        blocks = _BLOCKS[tag].findall(text)
        if blocks:
            block: str = blocks[0] if mode == "first" else blocks[-1]
            return block.strip()
    return ""


def clean_generation(text: str, mode: ExtractMode = "last") -> str:
    """The Lean code of a model answer: its chosen code block, else the answer without outer fences."""
    block = code_block(text, mode)
    if block:
        return block
    return _OUTER_FENCES.sub("", text).strip()


def proof_only(code: str) -> str:
    """What follows the first ``:=`` of the first ``theorem``/``example`` (and a leading ``by``)."""
    lines = code.strip().splitlines()
    if not lines:
        return ""
    start = next((i for i, line in enumerate(lines) if _DECLARATION.match(line)), None)
    if start is None:
        return code.strip()
    assign = next((i for i in range(start, len(lines)) if ":=" in lines[i]), None)
    if assign is None:
        return code.strip()
    rest = lines[assign].split(":=", 1)[1].strip()
    body = ([rest] if rest else []) + lines[assign + 1 :]
    if body:
        first = body[0].lstrip()
        if first == "by":
            body = body[1:]
        elif first.startswith("by "):
            body[0] = first[3:]
    return "\n".join(body).rstrip()


def build_code(
    text: str,
    header: str,
    formal_statement: str,
    *,
    mode: ExtractMode = "last",
    restate_formal_statement: bool = True,
    strip_theorem_from_proof: bool = True,
) -> str:
    """header + formal statement + proof: the file the sandbox compiles."""
    cleaned = clean_generation(text, mode)
    statement = formal_statement if restate_formal_statement else ""
    proof = proof_only(cleaned) if strip_theorem_from_proof else cleaned
    return header + statement + proof
