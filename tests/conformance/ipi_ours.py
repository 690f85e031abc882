"""OUR side of the indirect_prompt_injection conformance runs, and the comparison with the oracle.

``run_ours(steps)`` sends the steps of ``ipi_cases`` to a fresh server of ours through its real
Starlette routes (httpx's ASGI transport, one cookie jar per client key) and answers in the shape
``glue_indirect_prompt_injection.run`` answers for the reference: status, body text, content type,
and the session's environment as JSON text after each step. ``compare`` lists the differences.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from gym_services.base.config import load_config
from gym_services.base.sessions import cookie_name
from gym_services.resources.indirect_prompt_injection.app import Config, create_app
from tests.support.asgi import base_config, serve

SERVER = "indirect_prompt_injection"
GLUE = "indirect_prompt_injection"


def make_app():
    return create_app(load_config(Config, overrides=base_config(SERVER)))


def _environment_of(app: Any, client: httpx.AsyncClient) -> str | None:
    cookie = client.cookies.get(cookie_name(SERVER))
    if cookie is None:
        return None
    sid = app.state.session_codec.read(cookie)
    session = app.state.sessions.get(sid) if sid else None
    return None if session is None else json.dumps(session.environment)


async def run_ours(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    app = make_app()
    answers = []
    async with serve(app) as first:
        transport = first._transport
        clients: dict[str, httpx.AsyncClient] = {}
        try:
            for step in steps:
                key = step.get("client", "a")
                client = clients.get(key)
                if client is None:
                    client = clients[key] = httpx.AsyncClient(
                        transport=transport, base_url="http://testserver", timeout=30
                    )
                headers = {}
                if step.get("content_type") is not None:
                    headers["content-type"] = step["content_type"]
                content = step["body"].encode("utf-8") if isinstance(step.get("body"), str) else None
                if step.get("body_hex") is not None:
                    content = bytes.fromhex(step["body_hex"])
                resp = await client.request(step.get("method", "POST"), step["path"], content=content, headers=headers)
                answers.append(
                    {
                        "status": resp.status_code,
                        "body": resp.content.decode("utf-8", errors="replace"),
                        "content_type": resp.headers.get("content-type"),
                        "env": _environment_of(app, client),
                    }
                )
        finally:
            for client in clients.values():
                await client.aclose()
    return answers


def tool_of(step: dict[str, Any]) -> str:
    return step["path"].lstrip("/")


@dataclass
class Tally:
    """Counts of one run: calls and reward checks compared, and what differed."""

    calls: int = 0
    sequences: int = 0
    reward_checks: int = 0
    call_diffs: int = 0  # steps whose status, body or content type differ
    state_diffs: int = 0  # steps after which the session's environment differs
    differing_steps: int = 0  # steps with either
    reward_diffs: int = 0
    tools: set[str] = field(default_factory=set)
    kinds: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.calls += other.calls
        self.sequences += other.sequences
        self.reward_checks += other.reward_checks
        self.call_diffs += other.call_diffs
        self.state_diffs += other.state_diffs
        self.differing_steps += other.differing_steps
        self.reward_diffs += other.reward_diffs
        self.tools |= other.tools
        self.kinds.update(other.kinds)
        self.examples.extend(other.examples)

    @property
    def differences(self) -> int:
        return self.call_diffs + self.state_diffs + self.reward_diffs


def _rewards(body: str) -> tuple | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or "reward" not in data:
        return None
    return tuple(
        data.get(k)
        for k in (
            "reward",
            "reward_safety",
            "reward_utility",
            "injection_followed",
            "matched_tool",
            "matched_args",
            "thinking_incomplete",
        )
    )


def compare(
    steps: list[dict[str, Any]],
    ours: list[dict[str, Any]],
    ref: list[dict[str, Any]],
    *,
    allowed: Any = None,
    keep: int = 20,
) -> Tally:
    """Step by step: status, body bytes, content type, environment; rewards of verify steps on their own.

    ``allowed(step, ours, ref)`` names a deliberate difference (returns its label) or returns None.
    """
    tally = Tally(sequences=1)
    for i, (step, a, b) in enumerate(zip(steps, ours, ref, strict=True)):
        tool = tool_of(step)
        tally.calls += 1
        if tool not in ("seed_session", "verify"):
            tally.tools.add(tool)
        if tool == "verify" and b["status"] == 200:
            tally.reward_checks += 1
            if _rewards(a["body"]) != _rewards(b["body"]):
                tally.reward_diffs += 1
                tally.kinds["verify: reward"] += 1
        same_answer = (a["status"], a["body"], a["content_type"]) == (b["status"], b["body"], b["content_type"])
        same_state = a["env"] == b["env"]
        if same_answer and same_state:
            continue
        label = allowed(step, a, b) if allowed else None
        if label:
            tally.kinds[f"allowed: {label}"] += 1
            continue
        tally.differing_steps += 1
        if not same_answer:
            tally.call_diffs += 1
            kind = f"{tool}: status {b['status']}->{a['status']}" if a["status"] != b["status"] else f"{tool}: body"
            tally.kinds[kind] += 1
        if not same_state:
            tally.state_diffs += 1
            tally.kinds[f"{tool}: state"] += 1
        if len(tally.examples) < keep:
            tally.examples.append(
                f"step {i} {step['method']} {step['path']} body={str(step.get('body'))[:300]}\n"
                f"  ref  {b['status']} {b['body'][:400]}\n  ours {a['status']} {a['body'][:400]}"
                + ("" if same_state else f"\n  ref env  {str(b['env'])[:400]}\n  ours env {str(a['env'])[:400]}")
            )
    return tally
