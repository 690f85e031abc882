"""Our token ledger passes NeMo Gym 0.7.0's own ``run_conformance`` (``nemo_gym/token_id_capture/conformance.py``).

Real uvicorn policy model processes on 127.0.0.1; the wheel's suite runs unmodified in the oracle
environment, through adapter classes (``ledger_adapter.py``) that implement its ``TokenSink``,
``TokenSource`` and ``LineageResolver`` protocols over our ledger client and routes. ``begin_call`` is
implemented, so the suite's custody check runs too. With two replicas the client sends each rollout to
the replica its id hashes to, and the suite passes the same.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gym_services.base.affinity import replica_for
from tests.conformance.oracle.reference import ROOT
from tests.services.models.procs import ServerProcess, start_server
from tests.support.asgi import Control, base_config

ADAPTER = Path(__file__).with_name("ledger_adapter.py")
#: every check of the wheel's suite (begin_call_custody runs because our sink has begin_call)
EXPECTED = [
    "put_then_freeze_visibility",
    "idempotent_reput",
    "conflicting_reput",
    "mark_incomplete_durability",
    "freeze_idempotency",
    "post_freeze_write_safety",
    "conditional_retirement",
    "lineage_visibility",
    "fresh_client_lineage_visibility",
    "begin_call_custody",
]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """Two policy model processes (the ledger routes never reach the upstream: nothing listens there)."""
    config = base_config("policy_model", upstream={"base_url": "http://127.0.0.1:9/v1"})
    config.pop("name")
    started: list[ServerProcess] = []
    try:
        for ordinal in range(2):
            started.append(start_server("policy_model", config, tmp_path_factory.mktemp(f"ledger-model-{ordinal}")))
        yield started
    finally:
        for proc in started:
            proc.stop()


def run_suite(reference: Path, rollout_id: str, urls: list[str]) -> dict:
    from tests.conformance.oracle.reference import oracle_python

    done = subprocess.run(
        [str(oracle_python()), str(ADAPTER), "suite", str(reference), str(ROOT / "services"), rollout_id, *urls],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip(), done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def ledger_rollouts(proc: ServerProcess) -> int:
    async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
        return (await Control(client).status())["live"]["ledger_rollouts"]


def test_the_wheels_conformance_suite_passes_over_our_routes(replicas: list[ServerProcess], reference: Path) -> None:
    assert run_suite(reference, "one", [replicas[0].url]) == {"passed": EXPECTED}


def test_the_suite_passes_across_replicas_each_rollout_on_its_own(
    replicas: list[ServerProcess], reference: Path
) -> None:
    before = [asyncio.run(ledger_rollouts(proc)) for proc in replicas]
    assert run_suite(reference, "two", [proc.url for proc in replicas]) == {"passed": EXPECTED}
    rollouts = [f"two-{name.replace('_', '-')}" for name in EXPECTED]
    expected = [sum(1 for r in rollouts if replica_for(r, 2) == ordinal) for ordinal in range(2)]
    assert all(expected), expected  # the ids spread over both replicas
    added = [asyncio.run(ledger_rollouts(proc)) - was for proc, was in zip(replicas, before, strict=True)]
    assert added == expected


#: item lists in every dialect the lineage hashes read: chat, Responses, Anthropic blocks, odd content
HASH_CASES: list[list[dict]] = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "héllo — 你好 🙂"},
        {"role": "user", "content": ""},
    ],
    [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "x", "detail": "auto"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a cat", "annotations": []}],
        },
    ],
    [
        {"role": "user", "content": "call it"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get",
            "namespace": "tools",
            "arguments": '{"b": 2, "a": [1, 2.5]}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call", "id": "c2", "name": "put", "arguments": "not json "},
        {"type": "function_call_output", "call_id": "c2", "output": {"ok": True}},
    ],
    [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "tool", "tool_call_id": "t2", "content": [{"type": "json", "a": 1.5}]},
    ],
    [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me"},
                {"type": "tool_use", "id": "u1", "name": "g", "input": {"q": "é"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "u1", "content": [{"type": "text", "text": "r"}]},
                "plain",
            ],
        },
    ],
    [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"role": "user", "content": "no model turn"},
    ],
]


def test_our_lineage_hashes_equal_the_wheels(reference: Path) -> None:
    """Entries our recording stamps resolve in NeMo Gym's resolver, and theirs in ours: the same hashes."""
    from gym_services.models.policy_model.ledger.lineage import context_digest, fingerprint
    from tests.conformance.oracle.reference import oracle_python

    done = subprocess.run(
        [str(oracle_python()), str(ADAPTER), "hashes", str(reference)],
        input=json.dumps(HASH_CASES),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = json.loads(done.stdout)
    ours = [[fingerprint(items), context_digest(items)] for items in HASH_CASES]
    assert ours == theirs
    assert ours[0][0] == "" and ours[-1][0] == ""  # no model-authored item: a root
