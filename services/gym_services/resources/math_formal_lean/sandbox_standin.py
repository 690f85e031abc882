"""A stand-in for the Lean sandbox, for tests and the demo only.

**No Lean toolchain (Lean 4 + Mathlib) is installable in this environment**, so nothing
here compiles Lean. This small Starlette app answers the sandbox's ``POST /execute``
deterministically, in the sandbox's wire format (``{process_status, stdout, stderr}``),
from markers in the submitted code:

- code containing ``sorry``: compiles "successfully" with Lean's warning
  ``declaration uses 'sorry'`` (as real Lean does), which ``/verify`` grades ``has_sorry``;
- code containing :data:`VERIFIED_MARKER` (``-- gym-checkpoint: verified``): passes;
- anything else: fails with a Lean-like ``type mismatch`` error at the first proof line.

Directives for failure tests (``-- gym-checkpoint: <directive> <value>`` lines):
``compile-seconds S`` takes S seconds and reports ``timeout`` if S exceeds the request's
``timeout``; ``stall-seconds S`` answers only after S seconds (a stuck sandbox);
``http-status N`` answers HTTP N with a plain-text body (a broken sandbox).

The real sandbox is configured in math_formal_lean's config by ``sandbox_host`` and
``sandbox_port``; this stand-in replaces it in tests and the demo. Run it with
``gymckpt serve lean_sandbox_standin --port 6000`` or in process with :func:`create_app`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gym_services.base.config import CheckpointConfig, ServerConfig
from gym_services.base.errors import ApiError, api_error_handler
from gym_services.base.http import parse_body

VERIFIED_MARKER = "-- gym-checkpoint: verified"
MAX_SLEEP_S = 120.0
_DIRECTIVE = re.compile(r"--\s*gym-checkpoint:[ \t]*(?P<name>[a-z-]+)[ \t]+(?P<value>\S+)")
_DECL = re.compile(r"^\s*(?:theorem|lemma)\s+(?P<name>\S+)", re.MULTILINE)


class Config(ServerConfig):
    """Only host/port/log level matter: the stand-in is not a checkpoint participant."""

    checkpoint: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(enabled=False))


class ExecuteRequest(BaseModel):
    generated_code: str
    language: str = "lean4"
    timeout: float = Field(default=30.0, gt=0)
    max_output_characters: int = Field(default=1000, ge=1)


def _directives(code: str) -> dict[str, str]:
    return {m.group("name"): m.group("value") for m in _DIRECTIVE.finditer(code)}


def _seconds(value: str | None) -> float:
    try:
        return min(max(float(value or 0), 0.0), MAX_SLEEP_S)
    except ValueError:
        return 0.0


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "<output cut>"


def _file_name(code: str) -> str:
    """Like the real sandbox's temporary file, but stable for the same code."""
    return f"/lean4/my_project/tmp{hashlib.sha256(code.encode()).hexdigest()[:8]}.lean"


def _decl_position(lines: list[str]) -> tuple[int, int]:
    for number, text in enumerate(lines, 1):
        match = _DECL.match(text)
        if match:
            return number, match.start("name")
    return 1, 0


def _first_proof_line(lines: list[str]) -> tuple[int, int]:
    """The first non-blank line after the declaration's ``:= by``, else the last line."""
    start, _ = _decl_position(lines)
    seen_by = False
    for number in range(start, len(lines) + 1):
        text = lines[number - 1]
        if not seen_by:
            seen_by = ":= by" in text
            continue
        if text.strip() and not text.strip().startswith("--"):
            return number, len(text) - len(text.lstrip())
    last = max(len(lines), 1)
    text = lines[last - 1] if lines else ""
    return last, len(text) - len(text.lstrip())


def _goal(code: str) -> str:
    """The statement's conclusion (after the last top-level ``:``), for a plausible message."""
    match = _DECL.search(code)
    if not match:
        return "False"
    end = code.find(":=", match.end())
    signature = code[match.end() : end if end >= 0 else len(code)]
    depth = 0
    cut = -1
    for index, ch in enumerate(signature):
        if ch in "([{⦃⟨":
            depth += 1
        elif ch in ")]}⦄⟩":
            depth -= 1
        elif ch == ":" and depth == 0:
            cut = index
    goal = signature[cut + 1 :] if cut >= 0 else signature
    return " ".join(goal.split()) or "False"


def compile_lean(code: str) -> tuple[str, str, str]:
    """(process_status, stdout, stderr) for ``code``, by the rules in the module docstring."""
    lines = code.splitlines()
    path = _file_name(code)
    if "sorry" in code:
        line, col = _decl_position(lines)
        return "completed", f"{path}:{line}:{col}: warning: declaration uses 'sorry'\n", ""
    if VERIFIED_MARKER in code:
        return "completed", "", ""
    line, col = _first_proof_line(lines)
    message = (
        f"{path}:{line}:{col}: error: type mismatch\n  this\nhas type\n  True : Prop\n"
        f"but is expected to have type\n  {_goal(code)} : Prop\n"
    )
    return "failed", message, ""


async def execute(request: Request) -> JSONResponse | PlainTextResponse:
    body = await parse_body(request, ExecuteRequest)
    directives = _directives(body.generated_code)
    stall = _seconds(directives.get("stall-seconds"))
    if stall:
        await asyncio.sleep(stall)
    if "http-status" in directives:
        try:
            status = int(directives["http-status"])
        except ValueError:
            status = 500
        if 400 <= status <= 599:
            return PlainTextResponse(f"stand-in sandbox failure {status}", status_code=status)
    if body.language != "lean4":
        return JSONResponse(
            {"process_status": "error", "stdout": "", "stderr": f"unsupported language {body.language!r}"}
        )
    compile_s = _seconds(directives.get("compile-seconds"))
    if compile_s > body.timeout:
        await asyncio.sleep(min(body.timeout, MAX_SLEEP_S))
        return JSONResponse({"process_status": "timeout", "stdout": "", "stderr": "Timed out"})
    if compile_s:
        await asyncio.sleep(compile_s)
    status_, stdout, stderr = compile_lean(body.generated_code)
    limit = body.max_output_characters
    return JSONResponse({"process_status": status_, "stdout": _cut(stdout, limit), "stderr": _cut(stderr, limit)})


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok", "standin": True})


def create_app(config: Config | None = None) -> Starlette:
    config = config or Config(name="lean_sandbox_standin")
    app = Starlette(
        routes=[
            Route("/execute", execute, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/", health, methods=["GET"]),
        ],
        exception_handlers={ApiError: api_error_handler},
    )
    app.state.config = config
    return app
