"""math_formal_lean answers like NeMo Gym 0.7.0's: same calls and sandbox answers to both, bytes compared.

The reference is its own FastAPI app (``oracle/glue_math_formal_lean.py``); both servers' sandbox
clients talk to the same scripted sandbox (``oracle/sandbox_script.py``), which records what they
send. Compared per call: status, response bytes, and every request the sandbox received (URL,
content type, timeout, body bytes). No Lean toolchain exists here: the sandbox's answers are
scripted (every kind a NeMo Skills sandbox gives, the recorded compiler outputs of the reference's
example rollouts, and broken ones), so these tests cover everything around the compiler, not Lean.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gym_services.base.config import ConfigError, load_config
from gym_services.resources.math_formal_lean import feedback
from gym_services.resources.math_formal_lean.app import Config, create_app
from gym_services.resources.math_formal_lean.sandbox_client import LeanSandbox
from tests.conformance import lean_cases
from tests.conformance.http_cases import Tally, request_kwargs
from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.sandbox_script import ScriptedSandbox
from tests.support.asgi import base_config


@contextlib.asynccontextmanager
async def our_lean(sandbox: ScriptedSandbox, **overrides: Any) -> AsyncIterator[Starlette]:
    fields = {"sandbox_host": "127.0.0.1", "sandbox_port": 6000, **overrides}
    app = create_app(
        load_config(Config, overrides=base_config("math_formal_lean", **fields)), sandbox_transport=sandbox.transport
    )
    async with app.router.lifespan_context(app):
        yield app


async def run_ours(sequences: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our side of ``oracle/glue_math_formal_lean.run_sequences``: one app per config, a fresh session per sequence."""
    sandbox = ScriptedSandbox()
    results = []
    async with contextlib.AsyncExitStack() as stack:
        apps: dict[str, Starlette] = {}
        for sequence in sequences:
            config = sequence.get("config") or {}
            key = json.dumps(config, sort_keys=True)
            if key not in apps:
                try:
                    apps[key] = await stack.enter_async_context(our_lean(sandbox, **config))
                except ConfigError as exc:  # a config the reference accepts and ours refuses
                    results.append(
                        {"answers": [{"status": 0, "body": str(exc), "sandbox": []} for _ in sequence["calls"]]}
                    )
                    continue
            sandbox.load(sequence.get("sandbox", []))
            transport = httpx.ASGITransport(app=apps[key], raise_app_exceptions=False)
            answers = []
            async with httpx.AsyncClient(transport=transport, base_url="http://ours", timeout=60) as client:
                for call in sequence["calls"]:
                    reply = await client.request(call.get("method", "POST"), call["path"], **request_kwargs(call))
                    answers.append(
                        {
                            "status": reply.status_code,
                            "body": reply.content.decode("utf-8", errors="replace"),
                            "content_type": reply.headers.get("content-type"),
                            "sandbox": sandbox.take_received(),
                        }
                    )
            results.append({"answers": answers, "unused_answers": len(sandbox.script), "overdrawn": sandbox.overdrawn})
    return results


_PYDANTIC_URL = re.compile(r"errors\.pydantic\.dev/\d+\.\d+/")

#: Differences allowed, by name. None of them is a checkpoint-specific answer: math_formal_lean is stateless
#: and has none. Both are listed in the README.
ALLOWED = {
    "pydantic version in a 500 text": (
        "where the reference fails on a sandbox answer that is JSON but not a compiler output, both answer 500 "
        "with the same pydantic ValidationError text, except the documentation URL in it, which names the "
        "pydantic version (2.13 in NeMo Gym's lock, 2.14 ours)"
    ),
}


def lean_allowed(call: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    same_500 = ours.get("status") == theirs.get("status") == 500 and ours.get("sandbox") == theirs.get("sandbox")
    if same_500 and _PYDANTIC_URL.sub("", ours["body"]) == _PYDANTIC_URL.sub("", theirs["body"]):
        return "pydantic version in a 500 text"
    return None


async def compare(oracle: Oracle, name: str, sequences: list[dict[str, Any]]) -> Tally:
    theirs = oracle.call("math_formal_lean", "run_sequences", sequences)
    for ref in theirs:
        assert ref["overdrawn"] == 0 and ref["unused_answers"] <= 1
    ours = await run_ours(sequences)
    tally = Tally()
    tally.compare(name, sequences, ours, theirs, lean_allowed)
    return tally


def _bodies(tally_sequences: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(a["body"]) for r in results for a in r["answers"] if a["status"] == 200]


async def test_recorded_verifications_answer_byte_for_byte(oracle: Oracle, reference) -> None:
    """The reference's recorded rollouts, each verified with its recorded compiler output."""
    sequences = lean_cases.recorded_sequences(reference)
    tally = await compare(oracle, "recorded", sequences)
    assert not tally.differences and not tally.allowed, tally.summary()
    ours = await run_ours(sequences)
    recorded = [
        json.loads(line)
        for line in (reference / "resources_servers/math_formal_lean/data/example_rollouts.jsonl")
        .read_text()
        .splitlines()
    ]
    for body, row in zip(_bodies(sequences, ours), recorded, strict=True):
        assert (body["reward"], body["proof_status"], body["predicted_proof"]) == (
            row["reward"],
            row["proof_status"],
            row["predicted_proof"],
        )


async def test_perturbed_predictions_answer_byte_for_byte(oracle: Oracle) -> None:
    sequences = lean_cases.verification_sequences(300, seed=5)
    tally = await compare(oracle, "perturbed", sequences)
    assert not tally.differences, tally.summary()
    assert {a["allowed"] for a in tally.allowed} <= {"pydantic version in a 500 text"}
    statuses = {
        json.loads(a["body"])["proof_status"]
        for r in await run_ours(sequences[:120])
        for a in r["answers"]
        if a["status"] == 200
    }
    assert {"completed", "failed", "has_sorry", "timeout", "error", "empty_generation"} <= statuses


async def test_every_kind_of_sandbox_answer_is_read_alike(oracle: Oracle) -> None:
    sequences = lean_cases.sandbox_answer_sequences()
    tally = await compare(oracle, "sandbox answers", sequences)
    assert not tally.differences, tally.summary()
    assert sorted(a["sequence"] for a in tally.allowed) == [48, 49]  # the two CompilerOutput validation errors
    assert {a["allowed"] for a in tally.allowed} == {"pydantic version in a 500 text"}


async def test_invalid_bodies_and_other_routes(oracle: Oracle) -> None:
    sequences = lean_cases.invalid_sequences()
    tally = await compare(oracle, "invalid", sequences)
    assert not tally.differences, tally.summary()
    assert not tally.allowed, tally.allowed


async def test_the_comparison_catches_a_changed_rule(oracle: Oracle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: a changed feedback rule or sandbox request shows up as differences."""
    sequences = lean_cases.sandbox_answer_sequences()
    monkeypatch.setattr(feedback, "MAX_RAW_OUTPUT", 1999)
    assert (await compare(oracle, "cut at 1999", sequences)).differences
    monkeypatch.undo()
    monkeypatch.setattr(
        LeanSandbox,
        "request_body",
        staticmethod(
            lambda code, timeout_s, n: json.dumps(
                {"generated_code": code, "language": "lean4", "timeout": timeout_s, "max_output_characters": n},
                ensure_ascii=False,
            )
        ),
    )
    assert len((await compare(oracle, "unicode body", sequences)).differences) >= 40
