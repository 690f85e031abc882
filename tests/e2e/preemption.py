"""A preemption as a user lives it, through the CLI: the demo stack up with a schedule, a collection job followed by
``gymckpt collect``, SIGTERM (to every server, or one) with no checkpoint command, the stack checkpointing itself
and exiting, ``gymckpt up`` resuming it, the job completing; then the comparison with an uninterrupted run
(``docs/operations/preemption.md``). Used by ``test_preemption*.py``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gym_services.demo.report import Verdict, compare
from gym_services.demo.stack import demo_stack, write_tasks
from gym_services.demo.story import (
    MODEL,
    Run,
    Story,
    freeze_ledgers,
    job_status,
    model_status,
    model_tokens,
    read_results,
)
from gym_services.stack.history import StackHistory, read_history
from gym_services.stack.launcher import StackState, is_running, read_state, stack_secrets, stop_stack

#: slow enough that episodes are in flight at the signal on a busy machine, few enough tasks to stay lean
TOKENS_PER_SECOND = 40.0
TASKS_PER_ENVIRONMENT = 2
CONCURRENCY = 6
LEAN_VERIFICATIONS = "gym_lean_verifications_total{"


def gymckpt(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


class Preempted:
    """One stack in ``folder``: its YAML, tasks, the collect command following its job."""

    def __init__(self, folder: Path, *, storage: str | None = None, every: str = "2s", grace: str = "30s") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.state_dir = folder / ".gymckpt" / "stack"
        self.tasks = folder / "tasks.jsonl"
        self.agent_env = write_tasks(self.tasks, per_environment=TASKS_PER_ENVIRONMENT)
        self.output = folder / "results.jsonl"
        config = demo_stack(self.state_dir, tokens_per_second=TOKENS_PER_SECOND, job_dir=folder)
        raw: dict[str, Any] = config.model_dump(mode="json", exclude_none=True)
        if storage is not None:
            raw["storage"] = storage
        raw["checkpoint"] = {"every": every, "keep": 5, "termination_grace": grace}
        (folder / "stack.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        self.follower: subprocess.Popen[str] | None = None

    def up(self, *extra: str) -> str:
        proc = gymckpt("up", "stack.yaml", *extra, cwd=self.folder)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        return proc.stdout

    def state(self) -> StackState:
        return read_state(self.state_dir)

    def history(self) -> StackHistory:
        history = read_history(self.state_dir)
        assert history is not None
        return history

    def collect(self) -> None:
        """``gymckpt collect`` in the background, following the job through the stop and the resume."""
        self.follower = subprocess.Popen(
            [
                *(sys.executable, "-m", "gym_services.cli", "collect", str(self.tasks), "--output", str(self.output)),
                *("--concurrency", str(CONCURRENCY), "--state-dir", str(self.state_dir), "--stall-warning", "600"),
            ],
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_in_flight(self, share: float = 0.3, timeout_s: float = 120) -> dict[str, Any]:
        """Until ``share`` of the rollouts finished and some are in flight."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.follower is not None and self.follower.poll() is not None:
                raise AssertionError(f"`gymckpt collect` exited before the signal: {self.follower.communicate()}")
            job = job_status(self.state())
            if job["state"] == "completed":
                raise AssertionError("the job completed before the signal")
            if job.get("total") and job["finished"] >= max(1, round(share * job["total"])) and job["live"]:
                return job
            time.sleep(0.05)
        raise AssertionError(f"the job made no progress: {job_status(self.state())}")

    def running(self, agent: str) -> int:
        """The episodes ``agent`` runs now (its status ``live``)."""
        state = self.state()
        token = stack_secrets(self.state_dir)["control_token"]
        status = httpx.get(
            f"{state.url(agent)}/ng-control/v1/checkpoint/status",
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        ).json()
        return int(status["live"]["running"])

    def lean_verifications(self) -> float:
        """The proofs math-formal-lean has graded so far, whatever the grade (its ``gym_lean_verifications_total``)."""
        text = httpx.get(f"{self.state().url('math-formal-lean')}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(LEAN_VERIFICATIONS))

    def wait_lean_episode(self, timeout_s: float = 120) -> None:
        """Until the Lean agent runs an episode (a generation or a verification of it is coming)."""
        deadline = time.monotonic() + timeout_s
        while self.running("agent-lean") == 0:
            assert job_status(self.state())["state"] != "completed", "the job completed before a Lean episode ran"
            assert time.monotonic() < deadline, "no Lean episode ran"
            time.sleep(0.05)

    def wait_lean_verified(self, after: float, timeout_s: float = 60) -> None:
        """Until math-formal-lean graded a proof since it had graded ``after``."""
        deadline = time.monotonic() + timeout_s
        while self.lean_verifications() <= after:
            assert time.monotonic() < deadline, "math-formal-lean graded no proof"
            time.sleep(0.05)

    def wait_checkpoints(self, count: int = 1, timeout_s: float = 60) -> None:
        """Until the schedule published ``count`` checkpoints."""
        deadline = time.monotonic() + timeout_s
        while len((read_history(self.state_dir) or StackHistory()).kept) < count:
            assert time.monotonic() < deadline, "the schedule took no checkpoint"
            time.sleep(0.05)

    def terminate(self, names: Iterable[str] | None = None) -> None:
        """SIGTERM to the servers ``names`` (every server when None), as a preemption sends it."""
        state = self.state()
        for server in state.servers:
            if names is None or server.name in names:
                with contextlib.suppress(ProcessLookupError):  # one signalled before may have exited already
                    os.killpg(server.pid, signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 90) -> None:
        """Until every server and the supervisor exited."""
        state = self.state()
        processes = [*state.servers, *([state.supervisor] if state.supervisor else [])]
        deadline = time.monotonic() + timeout_s
        while any(is_running(p) for p in processes):
            assert time.monotonic() < deadline, [p.pid for p in processes if is_running(p)]
            time.sleep(0.05)

    def finish(self, timeout_s: float = 240) -> str:
        """The follower's output once the job completed, and the resumed stack's job completed (the follower may have
        seen the old stack complete it during the grace, before the resume rolled it back to its checkpoint)."""
        assert self.follower is not None
        out, err = self.follower.communicate(timeout=timeout_s)
        assert self.follower.returncode == 0, (out, err)
        deadline = time.monotonic() + timeout_s
        while job_status(self.state())["state"] != "completed":
            assert time.monotonic() < deadline, "the resumed job did not complete"
            time.sleep(0.1)
        return out + err

    def model_tokens_at_exit(self) -> int:
        """The tokens the policy model had received when it exited after the final checkpoint (its last log line says;
        nothing arrives after the cut)."""
        lines = (self.state_dir / "logs" / f"{MODEL}.log").read_text().splitlines()
        exits = [json.loads(line) for line in lines if '"msg": "exiting"' in line]
        assert exits, "the policy model did not log its exit"
        return int(exits[-1]["live"]["tokens_generated"])

    def run(self, tokens_before_cut: int) -> Run:
        """The job's results and ledgers and the tokens of the resumed stack."""
        state = self.state()
        run = Run(tokens_before_cut=tokens_before_cut)
        run.tokens_after_restore = model_tokens(model_status(state))
        read_results(self.output, run)
        import asyncio

        run.ledgers = asyncio.run(freeze_ledgers(state.urls(MODEL), sorted(run.results)))
        return run

    def close(self) -> None:
        if self.follower is not None and self.follower.poll() is None:
            self.follower.kill()
            self.follower.communicate()
        if self.state_dir.exists():
            stop_stack(self.state_dir, kill=True)


def uninterrupted(folder: Path) -> tuple[Run, dict[str, str]]:
    """The reference: the same tasks on the same stack, nothing interrupted."""
    story = Story(
        folder,
        repeats=1,
        concurrency=CONCURRENCY,
        tokens_per_second=TOKENS_PER_SECOND,
        tasks_per_environment=TASKS_PER_ENVIRONMENT,
        timeout_s=240,
        say=lambda text: None,
    )
    story.prepare()
    return story.uninterrupted(), story.agent_env


def verdict(base: Run, run: Run, agent_env: dict[str, str], *, tokens: bool = True) -> Verdict:
    return compare(base, run, agent_env, tokens=tokens)
