"""Infrastructure faults are not results: the demo stack as real uvicorn processes, rollout collection
running, and a server SIGKILLed or unreachable.

- the inference worker killed mid-generation (and, separately, while a checkpoint is open) and
  restarted: every episode finishes with the uninterrupted reward, no error row, and no token is
  generated twice (the policy model received exactly the uninterrupted run's tokens: what the dead
  worker streamed was kept as a prefix; a killed process's socket delivers what it wrote before the
  kernel closes it, and the worker counts a token only once written);
- the worker down for good: every episode fails clearly after the deadlines, the job ends (no hang);
- an agent and a resources server unreachable for a while: nothing is lost, nothing is an error;
- the policy model killed mid-generation and restarted: the agents try the broken-off generations again (no
  error row); a resources server killed mid-tool-call: the collection runs that episode again as attempt + 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator
from gym_services.demo.report import compare
from gym_services.demo.stack import demo_stack
from gym_services.demo.story import Run, Story
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import StackState, restart_server, stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e

WORKER, MODEL, COLLECTION = "inference-worker", "policy-model", "collection"
AGENTS = ("agent-workplace", "agent-ipi", "agent-lean", "agent-blackjack")
#: fast retries so a test waits for the restart, not for a backoff
RETRY_MODEL = {"upstream_retry": {"deadline_s": 120, "backoff_s": 0.05, "backoff_max_s": 0.3}}
RETRY_AGENT = {"unavailable_backoff_s": 0.05, "unavailable_backoff_max_s": 0.3}
RETRY_COLLECTION = {"unavailable_backoff_s": 0.05, "unavailable_backoff_max_s": 0.3}


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    story = Story(tmp_path_factory.mktemp("faults"), repeats=1, concurrency=32, timeout_s=240, say=lambda text: None)
    story.prepare()
    return story


@pytest.fixture(scope="module")
def reference(story: Story) -> Run:
    return story.uninterrupted()


class Faulty:
    """One demo stack with fault-friendly retry settings; servers can be killed and restarted."""

    def __init__(self, story: Story, name: str, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.story = story
        self.dir = story.workdir / name
        self.output = story.workdir / f"{name}.jsonl"
        config = demo_stack(self.dir, job_dir=story.workdir)
        tweaks = {MODEL: RETRY_MODEL, COLLECTION: RETRY_COLLECTION, **{a: RETRY_AGENT for a in AGENTS}}
        for server, extra in [*tweaks.items(), *(overrides or {}).items()]:
            _merge(config.servers[server].config, extra)
        self.state: StackState = start_stack(config, story.workdir, ready_timeout_s=120)
        self.token = stack_secrets(self.dir)["control_token"]
        # one client for every poll: httpx.get builds a TLS context each call (~20 ms of CPU), which polls every
        # 20 ms turned into half a core taken from the stack under test
        self.http = httpx.Client(timeout=10)

    def url(self, name: str) -> str:
        return self.state.url(name)

    def submit(self, **spec: Any) -> None:
        body = {
            "tasks_path": str(self.story.tasks_path),
            "output_path": str(self.output),
            "repeats": 1,
            "concurrency": 32,
            **spec,
        }
        resp = self.http.post(f"{self.url(COLLECTION)}/jobs", json=body, headers=self.auth, timeout=30)
        assert resp.status_code == 200, resp.text

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def job(self) -> dict[str, Any]:
        return self.http.get(f"{self.url(COLLECTION)}/jobs/current", headers=self.auth).json()

    def streaming(self) -> bool:
        """Generations in flight well into their streams."""
        live = self.model_live()
        return live["generations"] >= 3 and live["tokens_in_flight"] >= 30

    def model_live(self) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.token}"}
        return self.http.get(f"{self.url(MODEL)}/ng-control/v1/checkpoint/status", headers=headers).json()["live"]

    def live(self, name: str) -> dict[str, Any]:
        """What participant ``name`` holds now (its checkpoint status' ``live``)."""
        return self.http.get(f"{self.url(name)}/ng-control/v1/checkpoint/status", headers=self.auth).json()["live"]

    def kill(self, name: str) -> None:
        pid = next(s.pid for s in self.state.servers if s.name == name)
        os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def restart(self, name: str) -> None:
        restart_server(self.dir, name, ready_timeout_s=60)

    def wait_for(self, what: str, predicate, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; job {self.job()}"
            time.sleep(0.02)

    def finish(self, timeout_s: float = 240) -> Run:
        self.wait_for("the job to complete", lambda: self.job()["state"] == "completed", timeout_s)
        run = Run()
        for line in self.output.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["_ng_rollout_id"] in run.results:
                run.duplicates.append(row["_ng_rollout_id"])
            run.results[row["_ng_rollout_id"]] = row
        return run

    def stop(self) -> None:
        stop_stack(self.dir, kill=True)
        self.http.close()


@pytest.fixture
def stacks() -> Iterator[list[Faulty]]:
    started: list[Faulty] = []
    try:
        yield started
    finally:
        for stack in started:
            stack.stop()


def _merge(target: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _assert_equal_to_reference(story: Story, reference: Run, run: Run) -> None:
    verdict = compare(reference, run, story.agent_env, tokens=False)
    assert verdict.ok, verdict.problems
    assert not [row for row in run.results.values() if "error" in row]


def test_worker_killed_mid_generation_and_restarted_costs_nothing(story, reference, stacks) -> None:
    stack = Faulty(story, "worker-mid-generation")
    stacks.append(stack)
    stack.submit()
    stack.wait_for("generations streaming", stack.streaming)
    stack.kill(WORKER)
    stack.wait_for("generations waiting for the worker", lambda: stack.model_live()["waiting_for_upstream"] >= 1)
    time.sleep(1.0)  # down a while: every retry meanwhile is refused
    stack.restart(WORKER)
    run = stack.finish()
    live = stack.model_live()
    _assert_equal_to_reference(story, reference, run)
    assert live["tokens_generated"] == reference.tokens_generated  # 0 tokens regenerated
    assert live["upstream_failures"] > 0 and live["tokens_reused"] > 0
    assert stack.job()["reruns"] == 0


def test_worker_killed_during_a_checkpoint_costs_nothing(story, reference, stacks, tmp_path) -> None:
    stack = Faulty(story, "worker-during-checkpoint")
    stacks.append(stack)
    stack.submit()
    stack.wait_for("generations streaming", stack.streaming)

    async def checkpoint():
        async with ControlClient(stack.token, timeout_s=60) as client:
            participants = await discover(stack.state, client)

            async def on_event(phase: str, detail: dict) -> None:
                if phase == "Capturing":  # every generation cut, the checkpoint open
                    stack.kill(WORKER)

            coordinator = Coordinator(participants, client, on_event=on_event)
            return await coordinator.checkpoint("ck-worker", f"file://{tmp_path / 'store'}", prepare_timeout_s=60)

    result = asyncio.run(checkpoint())
    assert result.status == "completed", result.error
    time.sleep(1.0)  # resumed against a dead worker: the generations wait, keeping their prefixes
    stack.restart(WORKER)
    run = stack.finish()
    live = stack.model_live()
    _assert_equal_to_reference(story, reference, run)
    assert live["tokens_generated"] == reference.tokens_generated
    assert live["upstream_failures"] > 0


def test_worker_down_past_the_deadlines_fails_clearly_and_does_not_hang(story, stacks) -> None:
    overrides = {
        MODEL: {"upstream_retry": {"deadline_s": 0.5}},
        COLLECTION: {"unavailable_deadline_s": 2.0},
        **{agent: {"unavailable_deadline_s": 1.0} for agent in AGENTS},
    }
    stack = Faulty(story, "worker-gone", overrides)
    stacks.append(stack)
    stack.kill(WORKER)
    started = time.monotonic()
    stack.submit(limit=4)
    run = stack.finish(timeout_s=120)
    elapsed = time.monotonic() - started
    assert len(run.results) == 4 and not run.duplicates
    for row in run.results.values():
        assert row["reward"] is None
        assert "gave up after" in row["error"] and "upstream_unavailable" in row["error"], row["error"]
    job = stack.job()
    assert job["errors"] == 4 and job["reruns"] >= 4  # each ran again as attempt + 1 before giving up
    assert elapsed >= 2.0


def test_agent_and_resources_server_briefly_unreachable_cost_nothing(story, reference, stacks) -> None:
    stack = Faulty(story, "unreachable")
    stacks.append(stack)
    stack.kill("agent-ipi")  # the collection cannot reach this agent
    stack.kill("workplace-assistant")  # agent-workplace cannot reach its resources server
    stack.submit()
    time.sleep(1.5)
    assert stack.job()["finished"] < len(story.tasks)
    stack.restart("agent-ipi")
    stack.restart("workplace-assistant")
    run = stack.finish()
    _assert_equal_to_reference(story, reference, run)
    assert stack.job()["reruns"] == 0  # an unreachable agent got the same attempt again
    metrics = httpx.get(f"{stack.url('agent-workplace')}/metrics", timeout=10).text
    assert 'gym_agent_downstream_unavailable_total{server="resources"}' in metrics


def test_policy_model_killed_mid_generation_and_restarted_costs_nothing(story, reference, stacks) -> None:
    """The agents' model calls broken off by the kill (their connections reset, no answer) are generations, replay
    steps: each is tried again from its boundary once the model is back, in the same attempt (before: each was a
    ``502 upstream_error`` error row)."""
    stack = Faulty(story, "model-mid-generation")
    stacks.append(stack)
    stack.submit()
    stack.wait_for("generations streaming", stack.streaming)
    stack.kill(MODEL)
    time.sleep(0.5)  # down a while: the retries meanwhile are refused
    stack.restart(MODEL)
    run = stack.finish()
    _assert_equal_to_reference(story, reference, run)
    assert stack.job()["reruns"] == 0  # retried inside the agents, from the generate boundary


def test_resources_server_killed_mid_tool_call_runs_the_episode_again(story, reference, stacks) -> None:
    """A tool call broken off by its server's death may have happened there, so it is not run again in that attempt:
    the episode ends as an infrastructure failure and the collection runs it again as attempt + 1 (before: a ``502
    upstream_error`` error row). One episode only: a restarted resources server has lost every session, so any
    other episode of it would go on with tool errors."""
    stack = Faulty(story, "resources-mid-tool-call", {"workplace-assistant": {"tool_latency_s": 1.0}})
    stacks.append(stack)
    stack.submit(limit=1, concurrency=1)  # the first task is a Workplace one
    stack.wait_for("a tool call in flight", lambda: stack.live("agent-workplace")["waited"] >= 1)
    stack.kill("workplace-assistant")
    time.sleep(0.5)
    stack.restart("workplace-assistant")
    run = stack.finish()
    ((rollout_id, row),) = run.results.items()
    assert "error" not in row, row["error"]
    assert row["reward"] == reference.results[rollout_id]["reward"]
    assert row["_ng_attempt_index"] >= 1 and stack.job()["reruns"] >= 1
