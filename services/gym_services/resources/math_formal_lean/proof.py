"""From a model response to the Lean file the sandbox compiles (REFERENCE B.3).

Pure functions, so ``/verify`` depends only on its request: take the response's output
text, pick the last (or first) fenced code block, keep only the proof after the
theorem's ``:=`` / ``by``, and put it under the task's header and formal statement, so
a model cannot prove a different statement than the one asked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

ExtractMode = Literal["last", "first"]

LEAN_TAGS = ("lean4", "lean3", "lean")
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?P<tag>[A-Za-z0-9_+.-]*)[^\n]*\n(?P<body>.*?)^[ \t]*```",
    re.DOTALL | re.MULTILINE,
)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(?P<tag>[A-Za-z0-9_+.-]*)[^\n]*\n", re.MULTILINE)
_DECL = re.compile(
    r"^[ \t]*(?:@\[[^\]\n]*\][ \t]*\n?[ \t]*)?(?:(?:private|protected|nonrec)[ \t]+)*"
    r"(?:theorem|lemma)[ \t]+(?P<name>[^\s(:{\[⦃]+)",
    re.MULTILINE,
)
#: A command at column 0 ends the proof (a later lemma, ``end``, ``#eval``, ...).
_NEXT_COMMAND = re.compile(
    r"^(?:theorem|lemma|def|example|instance|abbrev|structure|inductive|class|namespace|section|end|open|"
    r"noncomputable|private|protected|set_option|variable|universe|#\w+|@\[)\b",
    re.MULTILINE,
)
_OPENERS = {"(": ")", "[": "]", "{": "}", "⟨": "⟩", "⦃": "⦄"}
_CLOSERS = set(_OPENERS.values())


def output_text(response: Mapping[str, Any] | None) -> str:
    """The Responses API ``output_text``: every ``output_text`` part of every message, joined."""
    if not response:
        return ""
    direct = response.get("output_text")
    if isinstance(direct, str):
        return direct
    parts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, Mapping) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            if item.get("role", "assistant") == "assistant":
                parts.append(content)
            continue
        for part in content or []:
            if isinstance(part, Mapping) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
    return "".join(parts)


def extract_code(text: str, mode: ExtractMode = "last") -> str:
    """The chosen fenced block; Lean-tagged blocks win over others.

    A response cut off inside its last block (no closing fence) yields what follows the
    opening fence; a response with no fence at all is taken whole, and Lean judges it.
    """
    blocks = [(m.group("tag").lower(), m.group("body")) for m in _FENCE.finditer(text)]
    if blocks:
        lean = [body for tag, body in blocks if tag in LEAN_TAGS]
        chosen = lean or [body for _, body in blocks]
        return chosen[-1] if mode == "last" else chosen[0]
    opened = list(_OPEN_FENCE.finditer(text))
    if opened:
        return text[opened[-1].end() :]
    return text


def theorem_name(formal_statement: str) -> str | None:
    match = _DECL.search(formal_statement)
    return match.group("name") if match else None


def _top_level_assign(code: str, start: int) -> int | None:
    """Index of the first ``:=`` after ``start`` that is not inside brackets (binder defaults are)."""
    depth: list[str] = []
    i = start
    while i < len(code) - 1:
        ch = code[i]
        if code.startswith("--", i):  # line comment
            newline = code.find("\n", i)
            i = len(code) if newline < 0 else newline
            continue
        if code.startswith("/-", i):  # block comment / docstring
            end = code.find("-/", i + 2)
            i = len(code) if end < 0 else end + 2
            continue
        if ch in _OPENERS:
            depth.append(_OPENERS[ch])
        elif ch in _CLOSERS:
            if depth and depth[-1] == ch:
                depth.pop()
        elif ch == ":" and code[i + 1] == "=" and not depth:
            return i
        i += 1
    return None


def _indent_block(lines: list[str], spaces: int) -> list[str]:
    return [(" " * spaces + line) if line.strip() else "" for line in lines]


def proof_body(code: str, formal_statement: str) -> str:
    """The tactic proof of the task's theorem in ``code``, ready to follow the statement's ``:= by`` line.

    Finds the declaration named like the task's theorem (else the last one), keeps what
    follows its top-level ``:=`` (and ``by``) up to the next command. A term proof becomes ``exact <term>``. A block
    with no declaration is taken as a tactic proof itself.
    """
    name = theorem_name(formal_statement)
    decls = list(_DECL.finditer(code))
    if not decls:
        lines = code.strip("\n").splitlines()
        if lines and all(not ln.strip() or ln[:1] in (" ", "\t") for ln in lines):
            return "\n".join(lines).rstrip()
        return "\n".join(_indent_block(lines, 2)).rstrip()
    named = [d for d in decls if d.group("name") == name]
    decl = (named or decls)[-1]
    assign = _top_level_assign(code, decl.end())
    if assign is None:
        return ""
    rest = code[assign + 2 :]
    following = _NEXT_COMMAND.search(rest)
    if following:
        rest = rest[: following.start()]
    stripped = rest.lstrip(" \t")
    if re.match(r"by(\s|$)", stripped):
        rest = stripped[2:]
        first, _, tail = rest.partition("\n")
        lines = ([first.strip()] if first.strip() else []) + tail.splitlines()
        if first.strip():
            lines = _indent_block(lines[:1], 2) + lines[1:]
        return "\n".join(lines).strip("\n").rstrip()
    term = stripped.strip("\n").rstrip().splitlines()
    if not term:
        return ""
    return "\n".join(["  exact " + term[0].strip(), *_indent_block(term[1:], 2)]).rstrip()


def build_code(
    header: str,
    formal_statement: str,
    code: str,
    *,
    restate_formal_statement: bool = True,
    strip_theorem_from_proof: bool = True,
) -> str:
    """header + formal statement + proof: the file the sandbox compiles."""
    header = header if not header or header.endswith("\n") else header + "\n"
    if not restate_formal_statement:
        return header + code.rstrip()
    statement = formal_statement if formal_statement.endswith("\n") else formal_statement + "\n"
    body = proof_body(code, formal_statement) if strip_theorem_from_proof else code.strip("\n").rstrip()
    return header + statement + body
