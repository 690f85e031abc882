"""Checkpoints at RL scale, where tokens dominate: thousands of live multi-turn rollouts with long contexts, a
checkpoint every 30 s, today's layout beside the new one in the same run.

The demo stack (every server its own process: the built-in inference worker, the policy model with
``return_token_id_information`` and ``record_tokens``, the four agents, the resources and environment servers, the
collection) collects the example tasks of the four environments, ``--per-environment`` rollouts of each at once (the
collection's concurrency is the total, so that many are live), every task's tools padded with archive tools until
each rollout's context ends near ``--context`` tokens (a realistic shape: a long system prompt and tool schemas,
a few hundred tokens a turn). Once they all run (and with ``--warm-up``, once every first call was answered),
a ``snapshot`` checkpoint is taken every ``--every`` seconds,
``--checkpoints`` times, while ``--clients`` probe clients call the policy model throughout and a trainer drops each
finished rollout's ledger (both in processes of their own: nothing but the coordinator runs in the event loop that
times the checkpoint); then every process is SIGKILLed and fresh ones restore the last checkpoint (and are seen to
carry on).

Each configuration runs on two code trees in turn: ``after`` (this checkout) and ``before`` (``--ref``, default the
commit this branch started from: today's layout), each a subprocess whose servers run that tree (``PYTHONPATH``, as
``before_after.py`` does). The figures are read from the stored checkpoints with this checkout's readers, which read
both layouts. Per checkpoint:

- **stored / floor**: the bytes the checkpoint's records hold (reused ones included) over the floor: every rollout's
  distinct token ids (its longest sequence) and each generated token's log-prob, 4 bytes each, plus the environments'
  own state (their records);
- **written / added**: the bytes the checkpoint wrote (new objects; the environments' excluded) over the tokens added
  since the previous checkpoint x 8 bytes (first checkpoint: every token);
- **worst call vs p99**: the probe clients' slowest call during the checkpoint against their p99 in the 30 s before;
- **published**, **restore** (into fresh processes, the last checkpoint), seconds;
- **RSS / raw tokens**: the resident memory the policy model and the agents gained since they started over the raw
  token bytes they hold (the model: every rollout of its ledger; an agent: its rollouts in the ledger, and the token
  arrays of the finished results it keeps, ``gym_agent_token_bytes{episodes="finished"}``), at the last checkpoint. A
  second table gives each process's resident memory at idle (started, before any rollout: the interpreter and its
  imports), right after the last checkpoint, the growth, the raw token bytes and the ratio. A third gives the cores
  the machine and each group of processes used in the ``--every`` seconds before each checkpoint and while it ran,
  and with ``--quiet`` the same for a window as long as the longest checkpoint with no checkpoint in it, after them
  (what the machine's own noise does to the probes' worst call).

``--heap`` breaks the growth down in the same run (idle to the last checkpoint): every policy model and agent loads
``held_memory.py``'s probe (a ``sitecustomize`` on their ``PYTHONPATH``: nothing in the servers' code, nothing in
production), which on ``SIGUSR1`` writes its resident memory, malloc's arenas (in use; free but kept), Python's
small-object arenas (in use; unused) and, in the servers ``--heap`` names, a tracemalloc snapshot taken from their
start; the growth of Python's allocations is grouped by kind (the training tokens: the ledger's stored entries and
the token arrays; other per-rollout state: parsed bodies, pydantic models, dicts, strings; connections and buffers:
the HTTP layers' bodies and buffers; other) and listed by allocation site. tracemalloc slows a server several
times and its bookkeeping is resident memory too: its figures are a run of their own (``--heap ''`` probes
without it).

    .venv/bin/python benchmarks/token_scale.py [--per-environment 256 1024] [--context 8192] [--long 32768:64]
        [--every 30] [--checkpoints 4] [--clients 4] [--ref REF] [--trees after before] [--json FILE]
        [--heap [SERVERS]] [--heap-frames 16] [--heap-trim] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._cpu import CpuClock  # noqa: E402

#: what the environments' rollouts add to their first prompt over an episode, tokens (measured with the built-in
#: worker's scripted policies and tokenizer: final context - first prompt, mean of the example tasks)
GROWTH = {"agent-workplace": 500, "agent-ipi": 420, "agent-blackjack": 80, "agent-lean": 220}
WORDS = (
    "ledger",
    "archive",
    "record",
    "shipment",
    "invoice",
    "customer",
    "quarterly",
    "forecast",
    "region",
    "warehouse",
    "contract",
    "renewal",
    "policy",
    "audit",
    "margin",
    "supplier",
    "routing",
    "pallet",
    "freight",
    "customs",
    "tariff",
    "compliance",
    "escalation",
    "backlog",
    "milestone",
    "budget",
    "variance",
    "headcount",
    "onboarding",
    "payroll",
    "benefits",
    "clinic",
    "referral",
    "dosage",
    "insurance",
    "claim",
    "deductible",
    "premium",
)


# --- the workload ---------------------------------------------------------------------------


def padding_tool(index: int, rng: random.Random) -> dict[str, Any]:
    """An archive tool with a long description: deterministic text, about 600 tokens of the built-in tokenizer."""
    description = " ".join(rng.choice(WORDS) for _ in range(240))
    return {
        "type": "function",
        "name": f"archive_lookup_{index}",
        "description": f"Looks up archived {description}.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": False,
    }


def first_prompt_tokens(row: dict[str, Any]) -> int:
    """The tokens of a task's first prompt as the built-in worker renders it (its messages and tools)."""
    from gym_services.models.inference_worker.tokenizer import render_chat

    params = row.get("responses_create_params") or {}
    items = params.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    turns = []
    for item in items:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        turns.append((str(item.get("role", "user")), str(content or "")))
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in params.get("tools") or []
    ]
    return len(render_chat(turns, tools or None))


def write_tasks(path: Path, per_environment: int, context: int) -> dict[int, str]:
    """Every environment's example tasks, cycled to ``per_environment`` rows each and interleaved (the collection
    dispatches rows in order: every environment's rollouts are live at once), each padded with archive tools until
    its context ends near ``context`` tokens; returns task index -> agent."""
    from gym_services.demo.stack import ENVIRONMENTS

    by_agent = {
        agent: [
            json.loads(line) for s in sources for line in s.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        for sources, agent in ENVIRONMENTS.values()
    }
    padded: dict[tuple[str, int], str] = {}
    lines: list[str] = []
    agents: dict[int, str] = {}
    for i in range(per_environment):
        for agent, rows in by_agent.items():
            key = (agent, i % len(rows))
            if key not in padded:  # rollouts of one task share their tools
                row = json.loads(json.dumps(rows[key[1]]))
                row["agent"] = agent
                params = row.setdefault("responses_create_params", {})
                rng = random.Random(f"{agent}-{key[1]}")
                tools = list(params.get("tools") or [])
                while first_prompt_tokens(row) + GROWTH[agent] < context - 300:
                    tools.append(padding_tool(len(tools), rng))
                    params["tools"] = tools
                padded[key] = json.dumps(row, ensure_ascii=False)
            agents[len(lines)] = agent
            lines.append(padded[key])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return agents


# --- one run on one tree (a subprocess: its imports are that tree's) -----------------------------


@dataclass
class CheckpointRun:
    checkpoint_id: str
    at: float
    status: str
    pause_s: float
    published_s: float | None
    live: int
    participants: dict[str, dict[str, Any]]  # participant id -> records, bytes, manifest_key
    rss_kib: dict[str, int]
    worst_call_s: float
    p99_before_s: float
    timings: dict[str, float] = field(default_factory=dict)
    dropped: int = 0  # rollouts the trainer dropped so far
    #: the drive's own event loop: how late it woke at worst during the checkpoint (:class:`LoopLag`)
    driver_lag_s: float = 0.0
    #: cores used (``benchmarks/_cpu.py``: the machine's busy ones, and each process's) in the ``--every`` seconds
    #: before the checkpoint and while it ran
    cores_before: dict[str, float] = field(default_factory=dict)
    cores_during: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class QuietWindow:
    """The same measures over a window as long as the longest checkpoint, with no checkpoint in it: the probes'
    worst call, their p99 in the ``--every`` seconds before, the cores used before and during."""

    length_s: float
    worst_call_s: float
    p99_before_s: float
    cores_before: dict[str, float]
    cores_during: dict[str, float]


@dataclass
class Drive:
    tree: str
    per_environment: int
    context: int
    location: str
    idle_rss_kib: dict[str, int] = field(default_factory=dict)
    #: --heap: the probe's answers (held_memory.py's PROBE) of the policy model and the agents, at idle and right
    #: after the last checkpoint (name -> its JSON; ``trace``: the tracemalloc snapshot's path, for the traced ones)
    idle_heap: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_heap: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: list[CheckpointRun] = field(default_factory=list)
    restore_s: float | None = None
    restore_status: str = ""
    finished_after_restore: int = 0
    ramp_s: float = 0.0
    #: the ramp and then until the token ledger held a call per rollout (``--warm-up`` at most)
    warm_s: float = 0.0
    load: list[float] = field(default_factory=list)
    #: each agent's model call bodies in flight right after the last checkpoint, MB (:func:`agent_gauges`)
    call_bytes_mb: dict[str, float] = field(default_factory=dict)
    #: and the finished results each keeps (for a repeated /run or a checkpoint), MB
    finished_mb: dict[str, float] = field(default_factory=dict)
    #: and the token arrays each holds by its own count: its live episodes', its kept results', MB
    live_token_mb: dict[str, float] = field(default_factory=dict)
    kept_token_mb: dict[str, float] = field(default_factory=dict)
    #: after the checkpoints, a window of the same length with none (--quiet)
    quiet: QuietWindow | None = None


def rss_of(state: Any) -> dict[str, int]:
    """VmRSS (KiB) of the policy model and the agents."""
    out = {}
    for server in state.servers:
        if measured(server.name):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[server.name] = int(line.split()[1])
    return out


def measured(name: str) -> bool:
    return name.startswith(("policy-model", "agent-"))


async def probe_heap(state: Any, tag: str, timeout_s: float = 900) -> dict[str, dict[str, Any]]:
    """--heap: SIGUSR1 to the policy model and the agents, whose probe (a ``sitecustomize``: nothing in the servers'
    code) writes what the process holds; their answers ({} without --heap)."""
    folder = os.environ.get("GYMCKPT_HEAP_PROBE")
    if not folder:
        return {}
    probe_dir = Path(folder)
    (probe_dir / "tag").write_text(tag)
    servers = [s for s in state.servers if measured(s.name)]
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGUSR1)
    out: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    for server in servers:
        path = probe_dir / f"{server.name}-{server.pid}-{tag}.json"
        while not path.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if not path.exists():
            print(f"  {server.name} did not answer the heap probe", file=sys.stderr, flush=True)
            continue
        found = json.loads(path.read_text())
        objects = found.pop("objects", {})
        found["objects"] = dict(sorted(objects.items(), key=lambda kv: -kv[1])[:40])
        trace = path.with_suffix(".trace")
        found["trace"] = str(trace) if trace.exists() else None
        out[server.name] = found
    return out


class Trainer:
    """What a trainer does with the token ledger: once a rollout's result row is written, freeze its ledger and drop
    that freeze (the acknowledgement that lets the policy model release the rollout's tokens), every few seconds. A
    freeze or drop parked by a checkpoint is tried again on the next round. It reads each row once, as it is
    appended (a row at 32k contexts is megabytes of JSON), and runs in a process of its own (:func:`helper_main`):
    parsing rows in the driver's event loop would stall the coordinator and the probes it times."""

    def __init__(self, model_url: str, results: Path, out: Path) -> None:
        from gym_services.models.policy_model.ledger.client import LedgerClient

        self.client = LedgerClient([model_url])
        self.results, self.out = results, out
        self.dropped: set[str] = set()
        self.finished: list[str] = []  # every rollout id with a row, in the order written
        self._read_at = 0

    def _new_rows(self) -> None:
        if not self.results.exists():
            return
        with self.results.open("rb") as f:
            f.seek(self._read_at)
            data = f.read()
        # a row the collection is still writing has no newline yet: read it next round
        complete = data[: data.rfind(b"\n") + 1]
        self._read_at += len(complete)
        for line in complete.split(b"\n"):
            if line.strip():
                self.finished.append(json.loads(line)["_ng_rollout_id"])

    async def run(self, stop: asyncio.Event) -> None:
        from gym_services.models.policy_model.ledger.client import LedgerRefused

        with self.out.open("a", encoding="utf-8") as out:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5)
                self._new_rows()
                for rollout_id in [r for r in self.finished if r not in self.dropped]:
                    if stop.is_set():
                        break  # the load is over: a round over hundreds of rollouts would hold the restore back
                    try:
                        frozen = await self.client.freeze(rollout_id)
                        await self.client.drop(rollout_id, frozen.snapshot_id, frozen.version)
                    except LedgerRefused as exc:
                        if exc.code not in ("not_found", "ledger_closed"):
                            continue  # parked by a checkpoint: the next round
                    except httpx.HTTPError:
                        continue
                    self.dropped.add(rollout_id)
                    out.write(rollout_id + "\n")
                    out.flush()
        await self.client.close()


class Probes:
    """Clients calling the policy model throughout: a cheap data call each (``/v1/ledger/resolve`` of a root request:
    admission, fencing and the event loop, no generation), parked calls retried as an agent does (every 20 ms);
    every call's start (``time.monotonic``: one clock for every process of the machine) and the seconds until it was
    answered, a line each in ``out``. In a process of its own (:func:`helper_main`), as a client of the model is."""

    def __init__(self, model_url: str, clients: int, out: Path) -> None:
        self.url, self.clients, self.out = model_url, clients, out

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            with self.out.open("a", encoding="utf-8") as out:
                await asyncio.gather(*(self._client(i, http, out, stop) for i in range(self.clients)))

    async def _client(self, index: int, http: httpx.AsyncClient, out: Any, stop: asyncio.Event) -> None:
        body = {"rollout_id": f"probe-{index}", "request_items": [{"role": "user", "content": "hello"}]}
        while not stop.is_set():
            start = time.monotonic()
            for _ in range(20_000):
                if stop.is_set():
                    return
                with contextlib.suppress(httpx.HTTPError):
                    resp = await http.post(f"{self.url}/v1/ledger/resolve", json=body)
                    if resp.status_code == 200:
                        break
                await asyncio.sleep(0.02)
            out.write(f"{start:.6f} {time.monotonic() - start:.6f}\n")
            out.flush()
            await asyncio.sleep(0.1)


def helper_main() -> None:
    """``token_scale.py probe|trainer URL OUT [CLIENTS|RESULTS]``: the probes or the trainer, until SIGTERM."""
    mode, url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        if mode == "probe":
            await Probes(url, int(sys.argv[4]), out).run(stop)
        else:
            await Trainer(url, Path(sys.argv[4]), out).run(stop)

    asyncio.run(run())


class Helper:
    """A :func:`helper_main` process of the drive, the lines it wrote so far, and its stop (SIGTERM, then SIGKILL)."""

    def __init__(self, *argv: str, out: Path) -> None:
        self.name = argv[0]
        self.out = out
        self.out.write_text("")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv[:2], str(out), *argv[2:]])

    def lines(self) -> list[str]:
        text = self.out.read_text(encoding="utf-8")
        return text[: text.rfind("\n") + 1].splitlines()  # the last line may be half written

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def probe_calls(helper: Helper) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in (line.split() for line in helper.lines())]


def worst_between(calls: list[tuple[float, float]], start: float, end: float) -> float:
    return max((s for at, s in calls if at < end and at + s > start), default=0.0)


def p99_before(calls: list[tuple[float, float]], start: float, window_s: float) -> float:
    before = sorted(s for at, s in calls if start - window_s <= at and at + s < start)
    return before[int(0.99 * (len(before) - 1))] if before else 0.0


class LoopLag:
    """How late the drive's own event loop woke (a sleep of 50 ms, again and again): the coordinator's timings are
    measured in it, so a stall there would be counted as the checkpoint's."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            at = time.monotonic()
            await asyncio.sleep(0.05)
            self.samples.append((at, time.monotonic() - at - 0.05))

    def worst_between(self, start: float, end: float) -> float:
        return max((lag for at, lag in self.samples if start <= at <= end), default=0.0)

    def stop(self) -> None:
        self._task.cancel()


async def participants_of(state: Any, token: str) -> list[Any]:
    """The stack's participants, asked once before the load starts (a server busy with thousands of rollouts may
    answer its status late)."""
    from gym_services.coordination.client import ControlClient
    from gym_services.stack.discovery import discover

    async with ControlClient(token, timeout_s=60) as client:
        return list(await discover(state, client))


async def _checkpoint(refs: list[Any], token: str, location: str, checkpoint_id: str) -> Any:
    from gym_services.coordination.client import ControlClient
    from gym_services.coordination.coordinator import Coordinator

    async with ControlClient(token, timeout_s=600) as client:
        coordinator = Coordinator(refs, client)
        return await coordinator.checkpoint(checkpoint_id, location, prepare_timeout_s=120, lease_s=300)


async def _restore(refs: list[Any], token: str, location: str, checkpoint_id: str) -> Any:
    from gym_services.coordination.client import ControlClient
    from gym_services.coordination.coordinator import Coordinator

    async with ControlClient(token, timeout_s=600) as client:
        return await Coordinator(refs, client).restore(checkpoint_id, location, lease_s=300)


async def worker_tokens(state: Any) -> int:
    """The tokens the inference worker generated so far (0 when it did not answer)."""
    async with httpx.AsyncClient(timeout=120) as http:
        try:
            resp = await http.get(f"{state.url('inference-worker')}/stats")
            return int(resp.json().get("tokens_generated", 0))
        except (httpx.HTTPError, ValueError):
            return 0


#: the agents' gauges read after the last checkpoint (the Prometheus sample's name, labels included)
AGENT_GAUGES = (
    "gym_agent_model_call_bytes_in_flight",  # what its proxy holds of the calls the model is generating
    "gym_agent_finished_result_bytes",  # the finished results it keeps
    'gym_agent_token_bytes{episodes="live"}',  # the token arrays its live episodes hold
    'gym_agent_token_bytes{episodes="finished"}',  # and its kept results
)


async def agent_gauges(state: Any) -> dict[str, dict[str, float]]:
    """Each of :data:`AGENT_GAUGES` -> each agent's value in MB, from one read of its ``/metrics``; an agent without
    a gauge (an earlier tree) or that did not answer is left out of it."""
    out: dict[str, dict[str, float]] = {gauge: {} for gauge in AGENT_GAUGES}
    async with httpx.AsyncClient(timeout=120) as http:
        for server in state.servers:
            if not server.name.startswith("agent-"):
                continue
            with contextlib.suppress(httpx.HTTPError):
                for line in (await http.get(f"{state.url(server.name)}/metrics")).text.splitlines():
                    sample, _, value = line.rpartition(" ")
                    if sample in out:
                        out[sample][server.name] = float(value) / 2**20
    return out


async def ledger_entries(state: Any, token: str) -> int:
    """The calls the policy model's token ledger holds (0 when it did not answer: a busy server)."""
    from gym_services.control.protocol import CONTROL_PREFIX

    async with httpx.AsyncClient(timeout=120) as http:
        try:
            resp = await http.get(
                f"{state.url('policy-model')}{CONTROL_PREFIX}/status", headers={"authorization": f"Bearer {token}"}
            )
            return int(resp.json()["live"].get("ledger_entries", 0))
        except (httpx.HTTPError, ValueError, KeyError):
            return 0


async def job_of(state: Any) -> dict[str, Any]:
    """The collection's job (its live and finished counts); {} when it did not answer (a busy server)."""
    from gym_services.stack.launcher import stack_secrets

    token = stack_secrets(Path(state.state_dir))["control_token"]
    async with httpx.AsyncClient(timeout=120) as http:
        try:
            resp = await http.get(
                f"{state.url('collection')}/jobs/current", headers={"authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError:
            return {}
    return resp.json() if resp.status_code == 200 else {}


def start_job(state: Any, token: str, workdir: Path, repeats: int, total: int) -> float:
    """Start the collection's job of ``total`` rollouts at once; returns when it started."""
    spec = {
        "tasks_path": str(workdir / "tasks.jsonl"),
        "output_path": str(workdir / "results.jsonl"),
        "repeats": repeats,  # as rollouts finish, the next ones start: the live count stays
        "concurrency": total,
    }
    auth = {"authorization": f"Bearer {token}"}
    resp = httpx.post(f"{state.url('collection')}/jobs", json=spec, headers=auth, timeout=300)
    resp.raise_for_status()
    return time.monotonic()


async def ramp_up(state: Any, token: str, total: int, started: float, warm_up: float) -> tuple[float, float]:
    """Wait until every rollout is live, then (``warm_up`` seconds at most from ``started``) until every one is past
    its first call: its whole first prompt, most of a rollout's distinct ids, on the model's side (at thousands of
    rollouts the first calls take minutes: the worker tokenizes every 8k-token prompt). Returns both waits' ends."""
    while (await job_of(state)).get("live", 0) < total and time.monotonic() - started < 1800:
        await asyncio.sleep(1)
    ramp_s = time.monotonic() - started
    while await ledger_entries(state, token) < total and time.monotonic() - started < warm_up:
        await asyncio.sleep(2)
    return ramp_s, time.monotonic() - started


def participant_figures(result: Any) -> dict[str, dict[str, Any]]:
    """Each participant's records, bytes and manifest in a checkpoint's result."""
    return {
        p.participant_id: {"records": p.records, "bytes": p.bytes, "manifest_key": p.manifest_key}
        for p in result.participants
    }


async def take_checkpoint(
    state: Any,
    refs: list[Any],
    token: str,
    location: str,
    checkpoint_id: str,
    started: float,
    every: float,
    helpers: list[Helper],
    lag: LoopLag,
    clock: CpuClock,
) -> CheckpointRun:
    """One checkpoint of the running stack and what it measured (``helpers``: the probes, then the trainer)."""
    probes, trainer = helpers
    clock.sample()  # the window's ends are samples of their own: a checkpoint may take less than a second
    began = time.monotonic()
    result = await _checkpoint(refs, token, location, checkpoint_id)
    ended = time.monotonic()
    clock.sample()
    calls = probe_calls(probes)
    taken = CheckpointRun(
        checkpoint_id=checkpoint_id,
        at=began - started,
        status=str(result.status),
        pause_s=result.pause_s,
        published_s=result.published_s,
        live=len(result.episodes),
        participants=participant_figures(result),
        rss_kib=rss_of(state),
        worst_call_s=worst_between(calls, began, ended),
        p99_before_s=p99_before(calls, began, every),
        driver_lag_s=lag.worst_between(began, ended),
        cores_before=clock.cores(began - every, began),
        cores_during=clock.cores(began, ended),
        timings=dict(result.timings),
        dropped=len(trainer.lines()),
        error=result.error,
    )
    steps = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
    print(
        f"  {checkpoint_id}: {result.status} pause {result.pause_s:.2f}s ({steps}); worst call "
        f"{taken.worst_call_s:.2f}s (p99 before {taken.p99_before_s:.2f}s), the drive's loop late "
        f"{taken.driver_lag_s:.2f}s at worst",
        file=sys.stderr,
        flush=True,
    )
    return taken


async def quiet_window(taken: list[CheckpointRun], every: float, probes: Helper, clock: CpuClock) -> QuietWindow:
    """``every`` seconds after the last checkpoint, a window as long as the longest one (published, or the pause of
    one that failed), with no checkpoint: what the machine's own noise does to the probes' worst call."""
    length = max((c.published_s or c.pause_s) for c in taken)
    await asyncio.sleep(every)
    clock.sample()
    began = time.monotonic()
    await asyncio.sleep(length)
    clock.sample()
    calls = probe_calls(probes)
    window = QuietWindow(
        length_s=length,
        worst_call_s=worst_between(calls, began, began + length),
        p99_before_s=p99_before(calls, began, every),
        cores_before=clock.cores(began - every, began),
        cores_during=clock.cores(began, began + length),
    )
    print(
        f"  no checkpoint, {length:.1f}s: worst call {window.worst_call_s:.2f}s (p99 before "
        f"{window.p99_before_s:.2f}s)",
        file=sys.stderr,
        flush=True,
    )
    return window


async def drive(args: argparse.Namespace) -> Drive:
    from gym_services.demo.stack import demo_stack
    from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

    workdir = Path(args.workdir)
    run = Drive(args.tree, args.per_environment, args.context, f"file://{workdir / 'store'}")
    total = 4 * args.per_environment

    def start(name: str) -> Any:
        config = demo_stack(
            workdir / name, tokens_per_second=args.tokens_per_second, latency_s=args.latency, job_dir=workdir
        )
        config.storage = run.location
        return start_stack(config, workdir, ready_timeout_s=300)

    state = start("stack")
    token = stack_secrets(workdir / "stack")["control_token"]
    helpers: list[Helper] = []
    try:
        refs = await participants_of(state, token)
        run.idle_rss_kib = rss_of(state)
        run.idle_heap = await probe_heap(state, "idle")
        started = start_job(state, token, workdir, args.repeats, total)
        run.ramp_s, run.warm_s = await ramp_up(state, token, total, started, args.warm_up)
        model = state.url("policy-model")
        helpers.append(Helper("probe", model, str(args.clients), out=workdir / "probe-calls.txt"))
        helpers.append(Helper("trainer", model, str(workdir / "results.jsonl"), out=workdir / "dropped.txt"))
        lag = LoopLag()
        clock = CpuClock(
            {
                **{s.name: s.pid for s in state.servers},
                **{f"{h.name} (benchmark)": h.proc.pid for h in helpers},
                "drive (benchmark)": os.getpid(),
            }
        )
        next_at = time.monotonic() + args.every
        for n in range(args.checkpoints):
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += args.every
            checkpoint_id = f"tok-{args.tree}-{args.per_environment}-{n}"
            run.checkpoints.append(
                await take_checkpoint(
                    state, refs, token, run.location, checkpoint_id, started, args.every, helpers, lag, clock
                )
            )
            run.load.append(os.getloadavg()[0])
        gauges = await agent_gauges(state)  # in AGENT_GAUGES order
        run.call_bytes_mb, run.finished_mb, run.live_token_mb, run.kept_token_mb = gauges.values()
        run.last_heap = await probe_heap(state, "last")
        if args.quiet and run.checkpoints:
            run.quiet = await quiet_window(run.checkpoints, args.every, helpers[0], clock)
        lag.stop()
        clock.stop()
        last = next((c for c in reversed(run.checkpoints) if c.status == "completed"), None)
    finally:
        for helper in helpers:
            helper.stop()
        stop_stack(workdir / "stack", kill=True)  # the crash: every process, SIGKILL
    if last is None:
        return run
    state = start("stack")
    try:
        refs = await participants_of(state, token)
        began = time.monotonic()
        result = await _restore(refs, token, run.location, last.checkpoint_id)
        run.restore_s, run.restore_status = time.monotonic() - began, str(result.status)
        before = await worker_tokens(state)
        await asyncio.sleep(30)
        run.finished_after_restore = await worker_tokens(state) - before  # the rollouts carry on: tokens generated
    finally:
        stop_stack(workdir / "stack", kill=True)
    return run


# --- reading the stored checkpoints (this checkout's readers: both layouts) ------------------------


@dataclass
class Stored:
    stored_bytes: int = 0
    env_bytes: int = 0
    written_bytes: int = 0
    env_written: int = 0
    rollout_tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # rollout -> (distinct ids, log-probs)
    by_participant: dict[str, int] = field(default_factory=dict)

    @property
    def floor_tokens(self) -> int:
        return sum(ids + lps for ids, lps in self.rollout_tokens.values())


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_checkpoint(root: Path, checkpoint: dict[str, Any]) -> Stored:
    """What one stored checkpoint holds: its records' bytes, what it wrote, and every rollout's tokens (from the
    policy model's token ledger and cut prefixes)."""
    from tests.support.records import restored_records

    from gym_services.models.policy_model.ledger.records import entry_sequence, is_ledger_record, parse_records
    from gym_services.models.policy_model.prefixes import read_records

    out = Stored()
    folder = root / "checkpoints" / checkpoint["checkpoint_id"]
    out.written_bytes = tree_size(folder)
    for pid, p in checkpoint["participants"].items():
        out.stored_bytes += p["bytes"]
        out.by_participant[pid] = p["bytes"]
        if not pid.startswith(("policy-model", "agent-", "collection")):
            out.env_bytes += p["bytes"]
            out.env_written += tree_size(folder / "participants" / pid)
        if pid.startswith("policy-model"):
            records = restored_records(f"file://{root}", p["manifest_key"])
            ledgers = parse_records([r for r in records if is_ledger_record(r.key)])
            for rollout_id, rows in ledgers.items():
                longest = max((len(s) for s in rows.entries.sequences()), default=0)
                generated = sum(len(t.generation_token_ids) for _, t in rows.entries.tokens(range(len(rows.entries))))
                out.rollout_tokens[rollout_id] = (longest, generated)
            generations = read_records(
                [r for r in records if not is_ledger_record(r.key)],
                lambda r, i, held=ledgers: entry_sequence(held[r], i),
            )
            for (rollout_id, _), staged in generations.items():
                if staged.tokens is None:
                    continue
                ids, lps = out.rollout_tokens.get(rollout_id, (0, 0))
                fresh = len(staged.tokens.sequence()) - ids  # a cut generation's new turn and what it generated
                out.rollout_tokens[rollout_id] = (ids + max(0, fresh), lps + len(staged.tokens.generation_token_ids))
    return out


@dataclass
class Figures:
    tree: str
    per_environment: int
    context: int
    live: list[int]
    stored_over_floor: list[float]
    written_over_added: list[float]
    worst_ms: list[float]
    p99_ms: list[float]
    pause_ms: list[float]
    published_s: list[float]
    restore_s: float | None
    restore_ok: bool
    rss_mb: dict[str, float]  # growth since idle, at the last checkpoint
    raw_mb: dict[str, float]
    #: the token arrays an agent holds by its own count (``gym_agent_token_bytes``), MB
    own_raw_mb: dict[str, float]
    idle_mb: dict[str, float]
    last_mb: dict[str, float]
    heap: dict[str, dict[str, Any]]  # --heap: process -> what grew (:func:`heap_growth`)
    stored_mb: list[float]
    written_mb: list[float]
    floor_mb: list[float]
    ramp_s: float
    warm_s: float
    load: list[float]
    statuses: list[str]
    call_bytes_mb: dict[str, float]
    finished_mb: dict[str, float] = field(default_factory=dict)
    #: how late the drive's own event loop woke at worst during each checkpoint (:class:`LoopLag`), ms
    driver_lag_ms: list[float] = field(default_factory=list)
    #: each checkpoint's window (and the quiet one's, last, when measured): its name, length s, worst call and p99
    #: before ms, cores used before and during (:func:`cpu_windows`)
    windows: list[dict[str, Any]] = field(default_factory=list)


def figures(run: dict[str, Any], tasks: dict[int, str]) -> Figures:
    root = Path(run["location"].removeprefix("file://"))
    stored = [read_checkpoint(root, c) if c["status"] == "completed" else Stored() for c in run["checkpoints"]]
    over_floor, over_added = [], []
    previous: dict[str, tuple[int, int]] = {}
    for s in stored:
        floor = 4 * s.floor_tokens + s.env_bytes
        over_floor.append(s.stored_bytes / floor if floor else float("nan"))
        added = sum(
            max(0, ids - previous.get(r, (0, 0))[0]) + max(0, lps - previous.get(r, (0, 0))[1])
            for r, (ids, lps) in s.rollout_tokens.items()
        )
        over_added.append((s.written_bytes - s.env_written) / (8 * added) if added else float("nan"))
        previous = s.rollout_tokens
    last = next((c for c in reversed(run["checkpoints"]) if c["status"] == "completed"), None)
    rss: dict[str, float] = {}
    raw: dict[str, float] = {}
    own_raw: dict[str, float] = {}
    idle = {name: kib / 1024 for name, kib in run["idle_rss_kib"].items()}
    at_last: dict[str, float] = {}
    if last is not None:
        s = stored[run["checkpoints"].index(last)]
        for name, kib in last["rss_kib"].items():
            at_last[name] = kib / 1024
            rss[name] = (kib - run["idle_rss_kib"].get(name, 0)) / 1024
        raw["policy-model"] = 4 * s.floor_tokens / 2**20
        for agent in {a for a in tasks.values()}:
            held = sum(
                ids + lps
                for r, (ids, lps) in s.rollout_tokens.items()
                if r.split("-")[0].isdigit() and tasks.get(int(r.split("-")[0])) == agent
            )
            # its rollouts' tokens as the ledger counts them (what their conversations amount to, the calls in flight
            # included: the agent holds those as its task's and the tools' text), and the arrays of the finished
            # results it keeps, which the trainer has had the ledger drop (a rollout whose drop is due in the next
            # few seconds counts twice)
            raw[agent] = 4 * held / 2**20 + run.get("kept_token_mb", {}).get(agent, 0.0)
            if agent in run.get("live_token_mb", {}):  # and its own count of the arrays it holds, when it reports it
                own_raw[agent] = run["live_token_mb"][agent] + run["kept_token_mb"].get(agent, 0.0)
    return Figures(
        tree=run["tree"],
        per_environment=run["per_environment"],
        context=run["context"],
        live=[c["live"] for c in run["checkpoints"]],
        stored_over_floor=over_floor,
        written_over_added=over_added,
        worst_ms=[1e3 * c["worst_call_s"] for c in run["checkpoints"]],
        p99_ms=[1e3 * c["p99_before_s"] for c in run["checkpoints"]],
        driver_lag_ms=[1e3 * c.get("driver_lag_s", 0.0) for c in run["checkpoints"]],
        pause_ms=[1e3 * c["pause_s"] for c in run["checkpoints"]],
        published_s=[c["published_s"] or float("nan") for c in run["checkpoints"]],
        restore_s=run["restore_s"],
        restore_ok=run["restore_status"] == "completed" and run["finished_after_restore"] > 0,
        rss_mb=rss,
        raw_mb=raw,
        own_raw_mb=own_raw,
        idle_mb=idle,
        last_mb=at_last,
        heap={
            name: heap_growth(run["idle_heap"][name], after)
            for name, after in run.get("last_heap", {}).items()
            if name in run.get("idle_heap", {})
        },
        stored_mb=[s.stored_bytes / 2**20 for s in stored],
        written_mb=[s.written_bytes / 2**20 for s in stored],
        floor_mb=[(4 * s.floor_tokens + s.env_bytes) / 2**20 for s in stored],
        ramp_s=run["ramp_s"],
        warm_s=run.get("warm_s", run["ramp_s"]),
        load=run["load"],
        statuses=[c["status"] for c in run["checkpoints"]],
        call_bytes_mb=run.get("call_bytes_mb", {}),
        finished_mb=run.get("finished_mb", {}),
        windows=cpu_windows(run),
    )


def cpu_windows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each checkpoint's window and the quiet one (--quiet), with the cores used grouped (:func:`grouped`)."""
    out = [
        {
            "window": c["checkpoint_id"].rsplit("-", 1)[1],
            "length_s": c["published_s"] or c["pause_s"],
            "worst_ms": 1e3 * c["worst_call_s"],
            "p99_ms": 1e3 * c["p99_before_s"],
            "before": grouped(c.get("cores_before", {})),
            "during": grouped(c.get("cores_during", {})),
        }
        for c in run["checkpoints"]
    ]
    quiet = run.get("quiet")
    if quiet:
        out.append(
            {
                "window": "none",
                "length_s": quiet["length_s"],
                "worst_ms": 1e3 * quiet["worst_call_s"],
                "p99_ms": 1e3 * quiet["p99_before_s"],
                "before": grouped(quiet["cores_before"]),
                "during": grouped(quiet["cores_during"]),
            }
        )
    return out


#: the groups the cores are reported in (:func:`group_of`)
CPU_GROUPS = ("machine", "policy model", "agents", "worker", "other servers", "benchmark")


def group_of(name: str) -> str:
    """The :data:`CPU_GROUPS` entry a process (or ``machine``) counts in."""
    if name == "machine":
        return "machine"
    if "(benchmark)" in name:
        return "benchmark"
    for prefix, group in (("policy-model", "policy model"), ("agent-", "agents"), ("inference-worker", "worker")):
        if name.startswith(prefix):
            return group
    return "other servers"


def grouped(cores: dict[str, float]) -> dict[str, float]:
    """Cores by :data:`CPU_GROUPS`; {} when nothing was measured."""
    out = dict.fromkeys(CPU_GROUPS, 0.0)
    for name, used in cores.items():
        out[group_of(name)] += used
    return out if cores else {}


def cpu_table(rows: list[Figures]) -> str:
    """Per checkpoint (and the window with none, --quiet): the probes' worst call against their p99 before, and the
    cores each group used before (the ``--every`` seconds before) and during, of the machine's."""
    groups = CPU_GROUPS
    lines = [
        "| rollouts (per env) | layout | checkpoint | window s | worst call ms (p99 before) | "
        + " | ".join(f"{g} cores before / during" for g in groups)
        + " |",
        "|" + "---|" * (5 + len(groups)),
    ]
    for f in rows:
        for w in f.windows:
            cells = [f"{w['before'].get(g, float('nan')):.2f} / {w['during'].get(g, float('nan')):.2f}" for g in groups]
            lines.append(
                f"| {4 * f.per_environment} ({f.per_environment}) | {f.tree} | {w['window']} | {w['length_s']:.1f} | "
                f"{w['worst_ms']:.0f} ({w['p99_ms']:.0f}) | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + f"\n(the machine's cores: {os.cpu_count()})"


# --- where the memory went (--heap) ----------------------------------------------------------------------

#: the kinds of memory a process's growth is grouped into (:func:`kind_of`)
KINDS = ("tokens", "per-rollout state", "connections/buffers", "other")
#: code that holds training tokens: the token arrays, the codec's stored entries, the ledger's entry log, the agents'
#: token tables
TOKEN_CODE = (
    "gym_services/base/token_arrays.py",
    "gym_services/base/token_codec.py",
    "gym_services/base/tokens.py",
    "gym_services/models/policy_model/ledger/entries.py",
    "gym_services/agents/common/tokens.py",
)
#: the HTTP and socket layers: a connection's buffers, a request's body as it is read
CONNECTION_CODE = (
    "/uvicorn/",
    "/h11/",
    "/httptools/",
    "/httpx/",
    "/httpcore/",
    "/anyio/",
    "/asyncio/",
    "/starlette/",
    "/ssl.py",
    "/socket.py",
)


def kind_of(frames: list[tuple[str, int]]) -> tuple[str, str]:
    """An allocation's kind, and the frame that decided it, from its traceback (oldest first): the innermost frame
    of the project's code or of the HTTP layers (the json or pydantic call in between is its caller's)."""
    for filename, lineno in reversed(frames):
        where = f"{filename.split('site-packages/')[-1].split('services/')[-1]}:{lineno}"
        if "gym_services/" in filename:
            return ("tokens" if filename.endswith(TOKEN_CODE) else "per-rollout state"), where
        if any(part in filename for part in CONNECTION_CODE):
            return "connections/buffers", where
    filename, lineno = frames[-1] if frames else ("?", 0)
    return "other", f"{filename.split('site-packages/')[-1].split('lib/python')[-1]}:{lineno}"


def heap_growth(idle: dict[str, Any], last: dict[str, Any], top: int = 12) -> dict[str, Any]:
    """What a process's probe saw grow from idle to the last checkpoint: resident memory, Python's allocations
    (traced, when tracemalloc ran: by kind and by the top sites), malloc's arenas (in use; free but kept) and Python's
    small-object arenas, MB."""
    import tracemalloc

    mib = 2**20
    out: dict[str, Any] = {
        "rss": (last["rss_kib"] - idle["rss_kib"]) / 1024,
        # --heap-trim: the growth once malloc_trim(0) gave back what malloc kept of the memory freed
        "trimmed": (last["trimmed_rss_kib"] - idle["rss_kib"]) / 1024 if last.get("trimmed_rss_kib") else None,
        "malloc_used": (last["malloc"].get("uordblks", 0) - idle["malloc"].get("uordblks", 0)) / mib,
        "malloc_free": (last["malloc"].get("fordblks", 0) - idle["malloc"].get("fordblks", 0)) / mib,
        "malloc_mmapped": (last["malloc"].get("hblkhd", 0) - idle["malloc"].get("hblkhd", 0)) / mib,
        "pymalloc_arenas": (last["pymalloc"].get("arenas", 0) - idle["pymalloc"].get("arenas", 0)) / mib,
        "pymalloc_unused": (
            last["pymalloc"].get("arenas", 0)
            - last["pymalloc"].get("allocated", 0)
            - idle["pymalloc"].get("arenas", 0)
            + idle["pymalloc"].get("allocated", 0)
        )
        / mib,
        "objects": sorted(((n - idle["objects"].get(t, 0), t) for t, n in last["objects"].items()), reverse=True)[:top],
    }
    if idle.get("trace") and last.get("trace") and last.get("traced") is not None:
        out["traced"] = (last["traced"] - idle["traced"]) / mib
        before = tracemalloc.Snapshot.load(idle["trace"])
        after = tracemalloc.Snapshot.load(last["trace"])
        kinds = dict.fromkeys(KINDS, 0.0)
        sites: dict[tuple[str, str, str], list[float]] = {}
        for diff in after.compare_to(before, "traceback"):
            frames = [(f.filename, f.lineno) for f in diff.traceback]
            kind, via = kind_of(frames)
            kinds[kind] += diff.size_diff / mib
            site = f"{frames[-1][0].split('site-packages/')[-1].split('services/')[-1]}:{frames[-1][1]}"
            grown = sites.setdefault((kind, site, via), [0.0, 0])
            grown[0] += diff.size_diff / mib
            grown[1] += diff.count_diff
        out["kinds"] = kinds
        largest = sorted(sites.items(), key=lambda site: -site[1][0])[:top]  # by MB grown
        out["sites"] = [[*k, *v] for k, v in largest]
    return out


def heap_table(rows: list[Figures]) -> str:
    """The --heap probes' growth, idle to the last checkpoint, per traced process; then each one's top sites."""
    lines = [
        "| rollouts | layout | process | RSS growth MB | traced MB | "
        + " | ".join(f"{k} MB" for k in KINDS)
        + " | pymalloc arenas MB (unused) | malloc in use MB | malloc free kept MB | RSS growth after malloc_trim MB |",
        "|" + "---|" * (10 + len(KINDS) - 1),
    ]
    details = []
    for f in rows:
        for name, h in sorted(f.heap.items()):
            kinds = h.get("kinds")
            traced = "- | " * len(KINDS) + "-"
            trimmed = "-" if h.get("trimmed") is None else f"{h['trimmed']:.0f}"
            if kinds:
                traced = f"{h['traced']:.0f} | " + " | ".join(f"{kinds[k]:.1f}" for k in KINDS)
            lines.append(
                f"| {4 * f.per_environment} | {f.tree} | {name} | {h['rss']:.0f} | {traced}"
                f" | {h['pymalloc_arenas']:.0f} ({h['pymalloc_unused']:.0f}) | {h['malloc_used']:.0f} | "
                f"{h['malloc_free']:.0f} | {trimmed} |"
            )
            if h.get("sites"):
                details.append(f"{name} ({4 * f.per_environment} rollouts, {f.tree}), top allocation sites:")
                details.extend(
                    f"  {size:8.1f} MB {count:+9d}  {kind:<20} {site}" + (f"  (via {via})" if via != site else "")
                    for kind, site, via, size, count in h["sites"]
                )
            grown = ", ".join(f"{t.rsplit('.', 1)[-1]} {n:+d}" for n, t in h["objects"] if n > 0)
            details.append(f"{name} ({4 * f.per_environment} rollouts, {f.tree}), objects grown: {grown}")
    return "\n".join([*lines, "", *details])


# --- the orchestration ---------------------------------------------------------------------------


def tree_env(services: Path) -> dict[str, str]:
    """The environment of a run on ``services``' tree (with --heap, the probe's folder first: its sitecustomize)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = [os.environ["GYMCKPT_HEAP_PROBE"]] if os.environ.get("GYMCKPT_HEAP_PROBE") else []
    env["PYTHONPATH"] = os.pathsep.join([*probe, str(services), str(ROOT)])
    return env


#: what the "before" tree gets of this checkout besides its own code: the fixes this workload needs, so both trees run
#: the same rollouts and differ in the layout only. Whole folders and files of this checkout: the collection's
#: connection pool (only 100 rollouts ran at once; its pools' module with it), the encoding child's descriptors past
#: 1024 (a server with a thousand connections could not write a checkpoint), the built-in worker's prompt cache and
#: float32 log-probs.
WORKLOAD = (
    "services/gym_services/collection",
    "services/gym_services/base/connection_pools.py",
    "services/gym_services/models/inference_worker",
    "services/gym_services/control/encoding.py",
)
#: and a fix in files whose other changes are the new layout's, as edits: the agents' pool per downstream server (in
#: one shared pool of 100 connections, generations starved the tool calls a checkpoint's prepare waits for)
WORKLOAD_EDITS = (
    (
        "services/gym_services/agents/common/service.py",
        'self.clients["net"] = cookieless_client(transport=self.transport, timeout_s=config.request_timeout_s)',
        'self.clients["net"] = cookieless_client(transport=self.transport, timeout_s=config.request_timeout_s, '
        "limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))",
    ),
    (
        "services/gym_services/agents/common/downstream.py",
        'base_url: str = ""\n) -> httpx.AsyncClient:\n    return httpx.AsyncClient(\n',
        'base_url: str = "", limits: httpx.Limits | None = None\n) -> httpx.AsyncClient:\n'
        "    return httpx.AsyncClient(\n        limits=limits or httpx.Limits(max_connections=100),\n",
    ),
)


def extract(ref: str, into: Path) -> Path:
    """``services/`` of ``ref`` in ``into`` (git archive), with this checkout's :data:`WORKLOAD` and
    :data:`WORKLOAD_EDITS` applied."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "services"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", ref, "--", *WORKLOAD], capture_output=True, check=True)
    if diff.stdout:
        subprocess.run(["git", "apply", "-"], cwd=into, input=diff.stdout, check=True)
    for path, old, new in WORKLOAD_EDITS:
        text = (into / path).read_text()
        if "limits" in text or "PooledTransport" in text or "transport: httpx.AsyncBaseTransport" in text:
            continue  # a ref since the fix: its own pools
        if old not in text:
            raise SystemExit(f"{ref}'s {path} is not what the benchmark's edit expects")
        (into / path).write_text(text.replace(old, new))
    return into / "services"


def run_tree(
    tree: str, services: Path, per_env: int, context: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    workdir = tmp / f"{tree}-{per_env}-{context}"
    workdir.mkdir(parents=True)
    shutil.copy(tmp / f"tasks-{per_env}-{context}.jsonl", workdir / "tasks.jsonl")
    out = workdir / "run.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "drive",
        "--tree",
        tree,
        "--workdir",
        str(workdir),
        "--per-environment",
        str(per_env),
        "--context",
        str(context),
        "--every",
        str(args.every),
        "--checkpoints",
        str(args.checkpoints),
        "--clients",
        str(args.clients),
        "--repeats",
        str(args.repeats),
        "--tokens-per-second",
        str(args.tokens_per_second),
        "--latency",
        str(args.latency),
        "--warm-up",
        str(args.warm_up),
        "--out",
        str(out),
        *(["--quiet"] if args.quiet else []),
    ]
    print(f"{tree}: {per_env} rollouts per environment, {context}-token contexts ...", file=sys.stderr, flush=True)
    drive = subprocess.Popen(command, env=tree_env(services))
    try:
        returncode = drive.wait(timeout=args.timeout)
    finally:  # a timeout, SIGTERM or ^C here: the drive stops its servers before it exits (SIGTERM, then SIGKILL)
        if drive.poll() is None:
            drive.terminate()
            try:
                drive.wait(timeout=60)
            except subprocess.TimeoutExpired:
                drive.kill()
                drive.wait()
    if returncode != 0:
        raise SystemExit(f"the run on {tree} failed (exit {returncode}); logs in {workdir}")
    run: dict[str, Any] = json.loads(out.read_text())
    return run


def table(rows: list[Figures]) -> str:
    def med(values: Sequence[float]) -> float:
        known = [v for v in values if v == v]
        return statistics.median(known) if known else float("nan")

    def spread(values: list[float]) -> str:
        values = [v for v in values if v == v]
        return f"{min(values):.2f}-{max(values):.2f}" if values else "-"

    head = (
        "| rollouts (per env) | context | layout | live | stored / floor | stored MB (floor MB) | written / added "
        "(2nd on) | written MB | pause ms | worst call ms (p99 before) | published s | restore s | RSS MB model / "
        "agents (raw token MB) |"
    )
    lines = [head, "|" + "---|" * 13]
    for f in rows:
        agents_rss = sum(v for k, v in f.rss_mb.items() if k.startswith("agent-"))
        agents_raw = sum(v for k, v in f.raw_mb.items() if k.startswith("agent-"))
        lines.append(
            f"| {4 * f.per_environment} ({f.per_environment}) | {f.context} | {f.tree} | {med(f.live):.0f} | "
            f"{spread(f.stored_over_floor)} | {med(f.stored_mb):.1f} ({med(f.floor_mb):.1f}) | "
            f"{spread(f.written_over_added[1:])} | {spread(f.written_mb)} | {med(f.pause_ms):.0f} | "
            f"{max(f.worst_ms, default=0):.0f} ({med(f.p99_ms):.0f}) | {max(f.published_s, default=0):.1f} | "
            f"{f.restore_s or float('nan'):.1f}{'' if f.restore_ok else ' (failed)'} | "
            f"{f.rss_mb.get('policy-model', 0):.0f} / {agents_rss:.0f} "
            f"({f.raw_mb.get('policy-model', 0):.0f} / {agents_raw:.0f}) |"
        )
    return "\n".join(lines)


def rss_table(rows: list[Figures]) -> str:
    """Each process's resident memory at idle (started, before any rollout) and right after the last checkpoint, its
    growth, the raw token bytes it holds then, and the growth over them (the target: at most 2); for an agent, beside
    its raw tokens the arrays it holds by its own count (``gym_agent_token_bytes``: a call in flight's prompt is not
    among them, and a rollout on its first call holds none), the bodies of the model calls it waits on then (each
    carries every earlier output item's token ids, as text) and the finished results it keeps, each also over its raw
    tokens."""
    lines = [
        "| rollouts (per env) | context | layout | process | idle MB | at last checkpoint MB | growth MB | "
        "raw token MB (as arrays, the agent's count) | growth / raw tokens | model call bodies in flight MB "
        "(/ raw tokens) | finished results kept MB (/ raw tokens) |",
        "|" + "---|" * 11,
    ]

    def of_raw(value: float | None, raw: float) -> str:
        return "-" if value is None else f"{value:.1f}" + (f" ({value / raw:.1f})" if raw else "")

    def total(gauge: dict[str, float], agents: list[str]) -> float | None:
        return sum(gauge[n] for n in agents) if all(n in gauge for n in agents) else None

    for f in rows:
        names = sorted(f.last_mb, key=lambda n: (not n.startswith("policy-model"), n))
        agents = [n for n in names if n.startswith("agent-")]
        entries = [
            (
                n,
                f.idle_mb.get(n, 0),
                f.last_mb[n],
                f.raw_mb.get(n, 0),
                f.own_raw_mb.get(n),
                f.call_bytes_mb.get(n),
                f.finished_mb.get(n),
            )
            for n in names
        ]
        if agents:
            entries.append(
                (
                    "agents (sum)",
                    sum(f.idle_mb.get(n, 0) for n in agents),
                    sum(f.last_mb[n] for n in agents),
                    sum(f.raw_mb.get(n, 0) for n in agents),
                    total(f.own_raw_mb, agents),
                    total(f.call_bytes_mb, agents),
                    total(f.finished_mb, agents),
                )
            )
        for name, idle, last, raw, own, body, finished in entries:
            ratio = f"{(last - idle) / raw:.1f}" if raw else "-"
            counted = f"{raw:.1f}" + (f" ({own:.1f})" if own is not None else "")
            lines.append(
                f"| {4 * f.per_environment} ({f.per_environment}) | {f.context} | {f.tree} | {name} | {idle:.0f} | "
                f"{last:.0f} | {last - idle:.0f} | {counted} | {ratio} | {of_raw(body, raw)} | "
                f"{of_raw(finished, raw)} |"
            )
    return "\n".join(lines)


def heap_probe(tmp: Path, servers: str, frames: int, trim: bool) -> None:
    """--heap: every server of the runs loads held_memory.py's probe (its ``sitecustomize``, first on their
    PYTHONPATH); tracemalloc follows ``servers`` from their start, ``frames`` deep; with ``trim`` each probe also
    reads the resident memory again after ``malloc_trim(0)``."""
    from benchmarks.held_memory import PROBE

    probe_dir = tmp / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    os.environ["GYMCKPT_HEAP_PROBE"] = str(probe_dir)
    os.environ["GYMCKPT_HEAP_TRACE"] = servers
    os.environ["GYMCKPT_HEAP_FRAMES"] = str(frames)
    if trim:
        os.environ["GYMCKPT_HEAP_TRIM"] = "1"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def drive_main() -> None:
    """One tree's run (``run_tree`` starts this in a process of its own): its figures into ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("drive")
    for name in ("--tree", "--workdir", "--out"):
        parser.add_argument(name, required=True)
    for name in ("--per-environment", "--context", "--checkpoints", "--clients", "--repeats"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--every", "--tokens-per-second", "--latency", "--warm-up"):
        parser.add_argument(name, type=float, required=True)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the servers' finalizers run
    run = asyncio.run(drive(args))
    Path(args.out).write_text(json.dumps(asdict(run), indent=1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-environment", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--long", default="32768:64", help="CONTEXT:PER_ENVIRONMENT of the long-context row ('' none)")
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument(
        "--warm-up",
        type=float,
        default=0.0,
        help="after every rollout is live, wait until the policy model's token ledger holds a call per rollout (every "
        "first call answered), at most this many seconds from the job's start, before the first checkpoint's interval",
    )
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4, help="rollouts of each task row, one after another")
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=4.0,
        help="the built-in worker's pace: slow, so thousands of rollouts stay live without more calls a second than "
        "two cores serve (default 4)",
    )
    parser.add_argument("--latency", type=float, default=0.02, help="tool and environment-step latency, seconds")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="after the checkpoints, measure a window as long as the longest one with no checkpoint in it (the "
        "machine's own noise, beside each checkpoint's)",
    )
    parser.add_argument("--ref", default=None, help="the 'before' tree (default: the merge base with main)")
    parser.add_argument("--trees", nargs="+", default=["after", "before"], choices=["after", "before"])
    parser.add_argument("--timeout", type=float, default=7200)
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--heap",
        nargs="?",
        const="policy-model,agent-workplace",
        default=None,
        metavar="SERVERS",
        help="break each process's memory growth down (idle to the last checkpoint): a probe in every policy model "
        "and agent (held_memory.py's), tracemalloc in SERVERS (default policy-model,agent-workplace) from their start. "
        "tracemalloc slows them and its own bookkeeping is resident memory too: a run of its own",
    )
    parser.add_argument("--heap-frames", type=int, default=16, help="frames tracemalloc keeps per allocation")
    parser.add_argument(
        "--heap-trim",
        action="store_true",
        help="with --heap: each probe also calls malloc_trim(0) and reads the resident memory again (what malloc "
        "kept of the memory freed, given back)",
    )
    return parser.parse_args()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        drive_main()
        return
    if len(sys.argv) > 1 and sys.argv[1] in ("probe", "trainer"):
        helper_main()
        return
    args = parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the running drive is stopped in run_tree's finally

    ref = (
        args.ref
        or subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-token-scale-"))
    configs = [(n, args.context) for n in args.per_environment]
    if args.long:
        context, per_env = (int(x) for x in args.long.split(":"))
        configs.append((per_env, context))
    rows: list[Figures] = []
    if args.heap is not None:
        heap_probe(tmp, args.heap, args.heap_frames, args.heap_trim)
    try:
        trees = {"after": ROOT / "services"}
        if "before" in args.trees:
            trees["before"] = extract(ref, tmp / "before")
        for per_env, context in configs:
            tasks = write_tasks(tmp / f"tasks-{per_env}-{context}.jsonl", per_env, context)
            for tree in args.trees:
                run = run_tree(tree, trees[tree], per_env, context, args, tmp)
                rows.append(figures(run, tasks))
                print(table(rows[-1:]), file=sys.stderr, flush=True)
                print(rss_table(rows[-1:]), file=sys.stderr, flush=True)
                print(cpu_table(rows[-1:]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"before = {ref[:10]} (today's layout), after = this checkout; {args.checkpoints} checkpoints every "
        f"{args.every:.0f} s; load {min(min(r.load, default=0) for r in rows):.1f}-"
        f"{max(max(r.load, default=0) for r in rows):.1f}"
    )
    print(table(rows))
    print()
    print(rss_table(rows))
    print()
    print(cpu_table(rows))
    if any(r.heap for r in rows):
        print()
        print(heap_table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
