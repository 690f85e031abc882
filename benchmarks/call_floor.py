"""What a live call costs a server's resident memory when it carries nothing: the floor under the policy model's and
the agents' "RSS <= 2x the raw tokens" target.

Real processes on 127.0.0.1. N calls are held open at once, each as small as a call gets, and the server's resident
memory is read (``/proc/<pid>/status``) before the first and once all N are in flight (and again after they end):

- **bare**: a Starlette route on uvicorn that waits until it is released (this process serves it): the web stack's
  own cost of an open request;
- **policy model**: ``POST /v1/responses`` with a one-word input and rollout identity, token information on, in front
  of the built-in inference worker holding every stream before its first token (``time_to_first_token_s``): the
  policy model's cost of a live generation (its request, its generation, its stream to the worker) with no token in
  it;
- **agent**: ``POST /run`` of a one-word task to ``simple_agent`` over the counter resources server (its session
  seeded), whose model call waits in the policy model above: an agent's cost of a live rollout (its ``/run`` call,
  its episode, its call to the model) with no token in it.

And what a live generation's request holds in the policy model beyond that floor (**request**): each environment's
first call of ``token_scale.py``'s tasks at 8k and 32k contexts (the task's input and its tools, padded to the
context), as its JSON bytes and as the model keeps it parsed while the generation runs (the response echoes its
tools), measured by tracemalloc in this process.

The growth per call (per rollout for the agent), and a request's, is set beside the raw tokens of one rollout at 8k
and 32k contexts (every distinct id and each generated token's log-prob, 4 bytes each: about 33 KB and 131 KB), whose
double is what the target allows a process per live rollout.

    .venv/bin/python benchmarks/call_floor.py [--calls 256 1024 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from benchmarks._serve import TOKEN, kill, start_server  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

from gym_services.control.protocol import CONTROL_PREFIX as CONTROL  # noqa: E402

#: one rollout's raw tokens at these contexts (ids and the generated tokens' log-probs, 4 bytes each), KB
RAW_KB = {8192: 4 * (8192 + 300) / 1024, 32768: 4 * (32768 + 300) / 1024}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def serve_bare(port: int) -> None:
    """The bare server: ``POST /hold`` waits until ``POST /release``."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    released = asyncio.Event()

    async def hold(request):  # type: ignore[no-untyped-def]
        await request.body()
        await released.wait()
        return JSONResponse({"ok": True})

    async def release(request):  # type: ignore[no-untyped-def]
        released.set()
        return JSONResponse({"ok": True})

    async def ready(request):  # type: ignore[no-untyped-def]
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/hold", hold, methods=["POST"]),
            Route("/release", release, methods=["POST"]),
            Route("/health/ready", ready),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


async def held(
    url: str,
    path: str,
    calls: int,
    body_of: Callable[[int], dict[str, Any]],
    headers_of: Callable[[int], dict[str, str]],
    until: Callable[[], Awaitable[bool]],
) -> tuple[list[asyncio.Task[httpx.Response]], float]:
    """Open ``calls`` calls at once; return them once ``until()`` says all are in, and how long that took."""
    client = httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))
    started = time.monotonic()
    tasks = [
        asyncio.create_task(client.post(f"{url}{path}", json=body_of(i), headers=headers_of(i))) for i in range(calls)
    ]
    for _ in range(1200):
        if await until():
            break
        await asyncio.sleep(0.25)
    else:
        raise RuntimeError(f"{calls} calls were not all in flight after 300 s")
    return tasks, time.monotonic() - started


async def measure_bare(calls: int, tmp: Path) -> tuple[float, float]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve-bare", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "bare.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        await asyncio.sleep(0.5)
        before = rss_kib(proc.pid)
        seen: list[int] = []

        async def until() -> bool:
            # every connection accepted and its body read: the server's connections settle
            seen.append(rss_kib(proc.pid))
            return len(seen) > 8 and seen[-1] == seen[-5]

        tasks, _ = await held(url, "/hold", calls, lambda i: {"input": "hi"}, lambda i: {}, until)
        during = rss_kib(proc.pid)
        async with httpx.AsyncClient() as client:
            await client.post(f"{url}/release")
        await asyncio.gather(*tasks, return_exceptions=True)
        return before / 1024, (during - before) / calls
    finally:
        proc.kill()
        proc.wait()


Started = list[tuple[subprocess.Popen[bytes], str]]


def start_model(tmp: Path, started: Started) -> str:
    """The built-in worker, holding every stream before its first token, and a policy model in front of it (each
    appended to ``started`` as it starts); the model's URL."""
    started.append(start_server("inference_worker", {"time_to_first_token_s": 600, "tokens_per_second": 1.0}, tmp))
    upstream = {"base_url": [f"{started[-1][1]}/v1"], "max_connections": 4096}
    started.append(start_server("policy_model", {"upstream": upstream, "return_token_id_information": True}, tmp))
    return started[-1][1]


async def growth_per_call(
    pid: int,
    url: str,
    path: str,
    calls: int,
    body_of: Callable[[int], dict[str, Any]],
    headers_of: Callable[[int], dict[str, str]],
    model_url: str,
) -> tuple[float, float]:
    """``pid``'s idle resident MB and its growth in KiB per call once ``calls`` calls to ``url``'s ``path`` are in
    flight (the model at ``model_url`` generating for every one)."""

    async def until() -> bool:
        async with httpx.AsyncClient(timeout=30) as client:
            status = await client.get(f"{model_url}{CONTROL}/status", headers={"authorization": f"Bearer {TOKEN}"})
        return int(status.json()["live"]["generations"]) >= calls

    await asyncio.sleep(0.5)
    before = rss_kib(pid)
    tasks, _ = await held(url, path, calls, body_of, headers_of, until)
    await asyncio.sleep(2)
    during = rss_kib(pid)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return before / 1024, (during - before) / calls


async def measure_model(calls: int, tmp: Path) -> tuple[float, float]:
    started: Started = []
    try:
        model_url = start_model(tmp, started)
        body = {"model": "workplace-oracle", "input": "hi"}
        return await growth_per_call(
            started[-1][0].pid,
            model_url,
            "/v1/responses",
            calls,
            lambda i: body,
            lambda i: {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"},
            model_url,
        )
    finally:
        for proc, _ in reversed(started):
            kill(proc)


async def measure_agent(calls: int, tmp: Path) -> tuple[float, float]:
    started: Started = []
    try:
        model_url = start_model(tmp, started)
        started.append(start_server("counter", {}, tmp))
        agent_config = {"model_url": model_url, "resources_url": started[-1][1], "model": "workplace-oracle"}
        started.append(start_server("simple_agent", agent_config, tmp))

        def row(i: int) -> dict[str, Any]:
            return {"responses_create_params": {"input": "hi"}, "target": 1, "_ng_rollout_id": f"r{i}"}

        agent, agent_url = started[-1]
        return await growth_per_call(agent.pid, agent_url, "/run", calls, row, lambda i: {}, model_url)
    finally:
        for proc, _ in reversed(started):
            kill(proc)


def measure_requests() -> list[tuple[int, str, int, int]]:
    """(context, agent, JSON bytes, bytes held parsed) of each environment's first task at 8k and 32k contexts."""
    import gc
    import json
    import tracemalloc

    from benchmarks.token_scale import write_tasks

    from gym_services.models.policy_model.app import drop_input_tokens
    from gym_services.models.policy_model.responses import ResponsesRequest

    out = []
    with tempfile.TemporaryDirectory(prefix="gymckpt-call-floor-tasks-") as tmp:
        for context in RAW_KB:
            agents = write_tasks(Path(tmp) / f"tasks-{context}.jsonl", 1, context)
            rows = (Path(tmp) / f"tasks-{context}.jsonl").read_text(encoding="utf-8").splitlines()
            for index, line in enumerate(rows):
                raw = json.dumps({**json.loads(line)["responses_create_params"], "model": "m"}).encode()
                gc.collect()
                tracemalloc.start()
                held = ResponsesRequest.model_validate(json.loads(raw))
                drop_input_tokens(held)
                size = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
                del held
                out.append((context, agents[index], len(raw), size))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[256, 1024, 2048])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gymckpt-call-floor-") as tmp:
        for calls in args.calls:
            bare_idle, bare = await measure_bare(calls, Path(tmp))
            model_idle, model = await measure_model(calls, Path(tmp))
            agent_idle, agent = await measure_agent(calls, Path(tmp))
            rows.append((calls, bare_idle, bare, model_idle, model, agent_idle, agent))
            print(
                f"  {calls} calls: bare {bare:.1f} KiB a call, policy model {model:.1f}, agent {agent:.1f}",
                file=sys.stderr,
            )
    requests = measure_requests()
    print(f"load {os.getloadavg()[0]:.1f}")
    print(
        "| calls in flight | bare: idle MB, KiB a call | policy model: idle MB, KiB a call | agent: idle MB, KiB a "
        "rollout | policy model per call / raw tokens of a rollout at 8k, 32k | agent per rollout / raw tokens at 8k, "
        "32k |"
    )
    print("|---|---|---|---|---|---|")
    for calls, bare_idle, bare, model_idle, model, agent_idle, agent in rows:
        print(
            f"| {calls} | {bare_idle:.0f}, {bare:.1f} | {model_idle:.0f}, {model:.1f} | "
            f"{agent_idle:.0f}, {agent:.1f} | "
            f"{model / RAW_KB[8192]:.2f}, {model / RAW_KB[32768]:.2f} | "
            f"{agent / RAW_KB[8192]:.2f}, {agent / RAW_KB[32768]:.2f} |"
        )

    print()
    print("| context | environment's agent | request JSON KB | held parsed KB | held parsed / a rollout's raw tokens |")
    print("|---|---|---|---|---|")
    for context, environment, size, parsed in requests:
        print(
            f"| {context} | {environment} | {size / 1024:.0f} | {parsed / 1024:.0f} | "
            f"{parsed / 1024 / RAW_KB[context]:.2f} |"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve-bare":
        serve_bare(int(sys.argv[2]))
    else:
        asyncio.run(main())
