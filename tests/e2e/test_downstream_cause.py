"""A resources server SIGKILLed mid-job: the cause reaches the collection and the user.

The agent keeps its episodes at their boundaries and retries the dead server itself, so its ``/run`` answers
nothing and the collection alone would only see that no episode finishes. The agent names what it waits for
(``GET /health/downstream``); the collection shows it in ``/jobs/current`` (``failing``, ``last_failure``) and
``gymckpt collect`` prints it; once ``gymckpt up`` has started the server again, it is cleared and the job
completes. Real uvicorn processes started by ``gymckpt up``, the server killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.services.commands.cli_support import gymckpt

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STACK = """\
name: cause
servers:
  inference-worker:
    server: inference_worker
    participant: false
    config: {tokens_per_second: 400.0, time_to_first_token_s: 0.01}
  policy-model:
    server: policy_model
    config: {upstream: {base_url: '{url:inference-worker}/v1'}}
  workplace-assistant:
    server: workplace_assistant
    config: {tool_latency_s: 0.05}
  agent-workplace:
    server: simple_agent
    config:
      model_url: '{url:policy-model}'
      model: workplace-oracle
      resources_url: '{url:workplace-assistant}'
      max_steps: 12
      unavailable_backoff_s: 0.05
      unavailable_backoff_max_s: 0.3
  collection:
    server: collection
    config:
      job_dirs: ['.']
      downstream_poll_s: 0.2
      agents: {agent-workplace: '{url:agent-workplace}'}
"""
#: the cause as the collection and `gymckpt collect` word it
CAUSE = re.compile(r"resources /\S+: unreachable since \d\d:\d\d:\d\d UTC \(\d+s; \d+ episodes? waiting\)")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "stack.yaml").write_text(STACK)
    rows = [line for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines() if '"agent-workplace"' in line]
    assert rows
    (tmp_path / "tasks.jsonl").write_text("\n".join(rows) + "\n")
    try:
        yield tmp_path
    finally:
        gymckpt("down", "--kill", cwd=tmp_path, check=False)


def _servers(folder: Path) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in json.loads((folder / ".gymckpt/stack/stack.json").read_text())["servers"]}


def _job(folder: Path) -> dict[str, Any]:
    token = json.loads((folder / ".gymckpt/stack/secrets.json").read_text())["control_token"]
    url = _servers(folder)["collection"]["url"]
    answer = httpx.get(f"{url}/jobs/current", headers={"authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _until(folder: Path, what: str, predicate, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = _job(folder)
        if predicate(job):
            return job
        assert time.monotonic() < deadline, f"timed out waiting for {what}; job {job}"
        time.sleep(0.05)


def _causes(job: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["server"], f["reason"]) for failures in job["failing"].values() for f in failures}


def test_a_killed_resources_server_is_named_as_the_cause_until_it_is_back(folder: Path) -> None:
    gymckpt("up", "stack.yaml", cwd=folder)
    gymckpt("collect", "tasks.jsonl", "--repeats", "8", "--concurrency", "4", "--no-wait", cwd=folder)
    _until(folder, "a first result", lambda job: job["finished"] >= 1)
    victim = _servers(folder)["workplace-assistant"]["pid"]
    os.killpg(victim, signal.SIGKILL)

    first = _until(folder, "the agent's cause in /jobs/current", lambda job: bool(job["failing"]))
    assert first["state"] == "running" and list(first["failing"]) == ["agent-workplace"], first
    # a call the kill cut mid-way is named first as broken off; the retries after it find the server gone
    assert _causes(first) <= {("resources", "broke_off"), ("resources", "unreachable")}, first["failing"]
    job = _until(folder, "the cause: unreachable", lambda job: _causes(job) == {("resources", "unreachable")})
    assert job["state"] == "running" and list(job["failing"]) == ["agent-workplace"], job
    assert job["last_failure"].startswith("agent agent-workplace: resources /"), job["last_failure"]
    assert CAUSE.search(job["last_failure"]), job["last_failure"]

    followed = gymckpt("collect", "--attach", "--stall-warning", "1", "--wait-timeout", "4", cwd=folder, check=False)
    assert followed.returncode == 1, (followed.stdout, followed.stderr)
    said = followed.stderr.splitlines()
    assert any(line.startswith("collect: agent agent-workplace waits for ") and CAUSE.search(line) for line in said), (
        said
    )
    stalled = [line for line in said if line.startswith("gymckpt collect: no episode has finished for ")]
    assert stalled, said
    assert (
        "cause: agent agent-workplace: resources /" in stalled[-1] and "not running: workplace-assistant" in stalled[-1]
    )

    assert gymckpt("up", "stack.yaml", cwd=folder).stdout.startswith("started workplace-assistant again from ")
    recovered = _until(folder, "the cause cleared", lambda job: not job["failing"] and job["last_failure"] is None)
    assert recovered["state"] in ("running", "completed")
    done = _until(folder, "the job to complete", lambda job: job["state"] == "completed", timeout_s=240)
    assert done["finished"] == done["total"] and done["failing"] == {} and done["last_failure"] is None
