"""math_formal_lean over ASGI: replay-safe verification, the stateless checkpoint contract, sandbox failures.

The Lean sandbox is the stand-in (no Lean toolchain here): in process through an ASGI
transport, or as a real uvicorn process on 127.0.0.1 (``standin_process``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from tests.services.resources.math_formal_lean.conftest import StandinProcess
from tests.support.asgi import Control, base_config, serve
from tests.support.ports import free_port

from gym_services.base.config import load_config
from gym_services.control.manifests import parse_participant_manifest
from gym_services.control.storage import open_storage
from gym_services.resources.math_formal_lean import sandbox_standin
from gym_services.resources.math_formal_lean.app import Config, create_app

DATA = Path(__file__).resolve().parents[4] / "services/gym_services/resources/math_formal_lean/data"
ROWS = [json.loads(line) for line in (DATA / "example.jsonl").read_text().splitlines()]
ROW = ROWS[0]
VERIFIED = sandbox_standin.VERIFIED_MARKER


def message(text: str) -> dict:
    """A Responses API object whose one message says ``text``."""
    item = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_1",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def generation(body: str, row: dict = ROW) -> str:
    return f"Plan: use the hypotheses.\n```lean4\n{row['header']}{row['formal_statement']}{body}\n```"


def answer(body: str, row: dict = ROW) -> dict:
    """A /verify body: the task row plus a response proving it with ``body``."""
    return {**row, "response": message(generation(body, row))}


def in_process_app(**extra):
    config = load_config(Config, overrides=base_config("math_formal_lean", **extra))
    return create_app(config, sandbox_transport=httpx.ASGITransport(app=sandbox_standin.create_app()))


def process_app(standin: StandinProcess, **extra):
    overrides = base_config("math_formal_lean", sandbox_host=standin.host, sandbox_port=standin.port, **extra)
    return create_app(load_config(Config, overrides=overrides))


# --- replay ---------------------------------------------------------------------------


async def test_same_verification_is_identical_everywhere(standin_process: StandinProcess) -> None:
    """Original server, after an unrelated verification, and a fresh server: byte-identical answers."""
    failing = answer("  nlinarith [h₁, h₂, h₃]")
    unrelated = answer(f"  {VERIFIED}\n  norm_num", ROWS[1])
    async with serve(process_app(standin_process)) as client:
        first = await client.post("/verify", json=failing)
        assert first.status_code == 200
        assert (await client.post("/verify", json=unrelated)).json()["proof_status"] == "completed"
        again = await client.post("/verify", json=failing)
    async with serve(process_app(standin_process), base_url="http://fresh") as client:
        fresh = await client.post("/verify", json=failing)
    assert first.content == again.content == fresh.content
    result = first.json()
    assert result["proof_status"] == "failed" and result["reward"] == 0.0 and result["needs_correction"] is True
    assert result["compiler_output"]["process_status"] == "failed"
    # the stand-in reports its error on stdout, like the real sandbox: the feedback is the raw output
    assert result["error_feedback"].startswith("Compilation output:\n/lean4/my_project/tmp")
    assert "type mismatch" in result["error_feedback"]
    # the request's create params and response are echoed back in NeMo Gym's canonical form; task fields are not
    assert "name" not in result and result["turn_index"] == 0
    assert result["responses_create_params"]["input"] == [
        {**ROW["responses_create_params"]["input"][0], "type": "message", "phase": None}
    ]
    assert result["responses_create_params"]["tool_choice"] == "auto" and result["response"]["usage"] is None


async def test_outcomes_from_the_standin() -> None:
    async with serve(in_process_app()) as client:
        passed = (await client.post("/verify", json=answer(f"  {VERIFIED}\n  norm_num [h₁, h₂, h₃]"))).json()
        sorry = (await client.post("/verify", json=answer("  sorry"))).json()
        empty = (await client.post("/verify", json={**ROW, "response": message("  \n"), "turn_index": 2})).json()
        no_response = await client.post("/verify", json={**ROW, "turn_index": 2})
    assert (passed["proof_status"], passed["reward"], passed["needs_correction"]) == ("completed", 1.0, False)
    assert passed["error_feedback"] is None and passed["correction_prompt"] is None
    proof_body = f"  {VERIFIED}\n  norm_num [h₁, h₂, h₃]"
    assert passed["predicted_proof"] == ROW["header"] + ROW["formal_statement"] + proof_body
    assert (sorry["proof_status"], sorry["reward"], sorry["needs_correction"]) == ("has_sorry", 0.0, True)
    assert (
        "declaration uses 'sorry'" in sorry["error_feedback"]
        and "declaration uses 'sorry'" in sorry["correction_prompt"]
    )
    assert (empty["proof_status"], empty["reward"], empty["needs_correction"]) == ("empty_generation", 0.0, True)
    assert empty["compiler_output"] is None and empty["predicted_proof"] == "" and empty["turn_index"] == 2
    assert empty["error_feedback"] == "Empty generation received. Please provide a valid Lean 4 proof."
    assert "\n\n(empty)\n\n" in empty["correction_prompt"]
    assert no_response.status_code == 422 and no_response.json()["detail"] == [
        {"type": "missing", "loc": ["body", "response"], "msg": "Field required", "input": {**ROW, "turn_index": 2}}
    ]


async def test_correction_prompt_carries_the_raw_attempt_and_errors() -> None:
    async with serve(in_process_app()) as client:
        result = (await client.post("/verify", json=answer("  linarith"))).json()
    prompt = result["correction_prompt"]
    assert prompt.startswith(
        f"Here is a proof attempt for the following theorem in Lean4.\n\n{generation('  linarith')}\n\n"
    )
    assert result["error_feedback"] in prompt and "type mismatch" in prompt


async def test_custom_template_and_bad_requests() -> None:
    async with serve(in_process_app(refinement_prompt_template="FIX:{error_message}|{proof_attempt}")) as client:
        result = (await client.post("/verify", json=answer("  simp"))).json()
        assert result["correction_prompt"] == f"FIX:{result['error_feedback']}|{generation('  simp')}"
        missing = await client.post("/verify", json={"response": message("x")})
        assert missing.status_code == 422
        assert [e["loc"][-1] for e in missing.json()["detail"]] == [
            "responses_create_params",
            "header",
            "formal_statement",
        ]
        broken = await client.post("/verify", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"


# --- the stateless checkpoint contract ----------------------------------------------------


async def test_stateless_replay_checkpoint(storage_url: str) -> None:
    async with serve(in_process_app()) as client:
        control = Control(client)
        seeded = await client.post("/seed_session", json=ROW)
        assert seeded.status_code == 200 and seeded.headers["x-ng-checkpoint-verify"] == "replay"
        status = await control.status()
        assert (status["checkpoint_mode"], status["checkpoint_verify"]) == ("stateless", "replay")
        assert status["role"] == "resources" and status["blockers"] == []

        prepared = await control.prepare("ck1")
        assert prepared["status"] == "prepared"
        served = await client.post("/verify", json=answer(f"  {VERIFIED}\n  norm_num"))
        assert served.status_code == 200 and served.json()["reward"] == 1.0
        assert (await client.post("/seed_session", json=ROW)).status_code == 200
        committed = await control.capture_persist("ck1", storage_url)
        assert committed["records"] == 0 and committed["bytes"] == 0 and committed["episodes"] == []
        await control.resume("ck1")

    store = open_storage(storage_url)
    keys = store.list("checkpoints/ck1")
    assert not [k for k in keys if "/packs/" in k]
    manifest = parse_participant_manifest(store.get(committed["manifest_key"]))
    assert manifest.records.keys == [] and manifest.checkpoint_mode == "stateless"

    async with serve(in_process_app(), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore("ck1", storage_url, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["records"] == 0
        await control.resume("ck1")
        assert (await client.post("/verify", json=answer("  simp"))).json()["proof_status"] == "failed"


async def test_inflight_verification_does_not_hold_prepare(standin_process: StandinProcess) -> None:
    """A replay /verify is not waited for: prepare answers while it still compiles, and it completes."""
    slow = answer(f"  -- gym-checkpoint: compile-seconds 1.0\n  {VERIFIED}\n  norm_num")
    async with serve(process_app(standin_process)) as client:
        control = Control(client)
        verifying = asyncio.create_task(client.post("/verify", json=slow))
        await asyncio.sleep(0.2)
        assert (await control.status())["inflight"] == 1
        prepared = await control.prepare("ck1")
        assert prepared["status"] == "prepared" and prepared["waited_s"] < 0.5
        assert not verifying.done()
        result = await asyncio.wait_for(verifying, 10)
        assert result.status_code == 200 and result.json()["reward"] == 1.0
        await control.abort("ck1")


# --- sandbox failures -------------------------------------------------------------------


async def test_sandbox_down_is_a_result() -> None:
    port = free_port()
    app = create_app(load_config(Config, overrides=base_config("math_formal_lean", sandbox_port=port)))
    async with serve(app) as client:
        resp = await client.post("/verify", json=answer("  simp"))
    assert resp.status_code == 200
    result = resp.json()
    assert (result["proof_status"], result["reward"], result["needs_correction"]) == ("error", 0.0, True)
    assert result["compiler_output"]["process_status"] == "error" and result["compiler_output"]["stderr"]
    assert result["error_feedback"] == f"Compilation output:\n\n{result['compiler_output']['stderr']}"


async def test_sandbox_http_errors_are_results(standin_process: StandinProcess) -> None:
    async with serve(process_app(standin_process)) as client:
        plain_500 = (await client.post("/verify", json=answer("  -- gym-checkpoint: http-status 500\n  simp"))).json()
        bad_gateway = (await client.post("/verify", json=answer("  -- gym-checkpoint: http-status 502\n  simp"))).json()
    assert (plain_500["proof_status"], plain_500["reward"]) == ("error", 0.0)
    assert plain_500["compiler_output"] == {"process_status": "error", "stdout": "", "stderr": "Invalid JSON response"}
    assert bad_gateway["compiler_output"] == {"process_status": "error", "stdout": "", "stderr": "Sandbox 502 error"}


async def test_sandbox_timeouts_are_results(standin_process: StandinProcess) -> None:
    """The sandbox reporting a timeout, and a sandbox that does not answer in time."""
    fast = {"compilation_timeout": 0.3, "sandbox_timeout_margin_s": 0.2}
    async with serve(process_app(standin_process, **fast)) as client:
        reported = (await client.post("/verify", json=answer("  -- gym-checkpoint: compile-seconds 5\n  simp"))).json()
        stalled = await client.post("/verify", json=answer("  -- gym-checkpoint: stall-seconds 3\n  simp"))
    assert (reported["proof_status"], reported["reward"]) == ("timeout", 0.0)
    assert reported["compiler_output"]["process_status"] == "timeout"
    assert (
        reported["error_feedback"]
        == "The compilation timed out. Please simplify your proof or use more efficient tactics."
    )
    assert stalled.status_code == 200
    result = stalled.json()
    assert (result["proof_status"], result["reward"], result["needs_correction"]) == ("timeout", 0.0, True)
    assert result["compiler_output"] == {"process_status": "timeout", "stdout": "", "stderr": "Client timed out"}


async def test_sandbox_reply_that_is_not_a_compiler_output_fails_like_the_reference() -> None:
    """NeMo Gym's server answers 500 with the error's repr; so does ours (and logs it)."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"stdout": "no status"})

    config = load_config(Config, overrides=base_config("math_formal_lean"))
    async with serve(create_app(config, sandbox_transport=httpx.MockTransport(handler))) as client:
        resp = await client.post("/verify", json=answer("  simp"))
        metrics = (await client.get("/metrics")).text
    assert resp.status_code == 500
    assert resp.json().startswith("2 validation errors for CompilerOutput\nprocess_status\n  Field required")
    assert 'proof_status="server_error"' in metrics


async def test_standin_process_truncates_output(standin_process: StandinProcess) -> None:
    code = "theorem t : " + "a = a ∧ " * 300 + "True := by\n  simp"
    async with httpx.AsyncClient(base_url=f"http://{standin_process.host}:{standin_process.port}") as client:
        body = {"generated_code": code, "timeout": 5, "max_output_characters": 100}
        reply = (await client.post("/execute", json=body)).json()
        other = (await client.post("/execute", json={"generated_code": "x", "language": "python", "timeout": 5})).json()
    assert reply["process_status"] == "failed" and reply["stdout"].endswith("<output cut>")
    assert len(reply["stdout"]) == 100 + len("<output cut>")
    assert other["process_status"] == "error"


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
async def test_every_shipped_example_verifies_with_the_marker(row: dict) -> None:
    async with serve(in_process_app()) as client:
        result = (await client.post("/verify", json=answer(f"  {VERIFIED}\n  norm_num", row))).json()
    assert result["reward"] == 1.0 and result["predicted_proof"].startswith(row["header"] + row["formal_statement"])
