"""The demo stack: every shipped server as its own local process, and the example tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym_services.demo.workers import WORKER_KINDS
from gym_services.stack.config import SINGLE_REPLICA, ServerSpec, StackConfig

PACKAGE = Path(__file__).resolve().parents[1]
#: the sampling seed every generation of the demo is asked for
SEED = 20261202

IPI_DATA = PACKAGE / "resources/indirect_prompt_injection/data"

#: environment -> (example task files, agent instance that runs them)
ENVIRONMENTS: dict[str, tuple[tuple[Path, ...], str]] = {
    "workplace_assistant": ((PACKAGE / "resources/workplace_assistant/data/example.jsonl",), "agent-workplace"),
    # NeMo Gym's healthcare and HR examples, and one task of each of the other seven domains
    "indirect_prompt_injection": ((IPI_DATA / "example.jsonl", IPI_DATA / "domain_examples.jsonl"), "agent-ipi"),
    "blackjack": ((PACKAGE / "resources/blackjack/data/example.jsonl",), "agent-blackjack"),
    "math_formal_lean": ((PACKAGE / "resources/math_formal_lean/data/example.jsonl",), "agent-lean"),
}


def write_tasks(path: Path, max_output_tokens: int | None = None, per_environment: int | None = None) -> dict[str, str]:
    """The example tasks in one JSONL, each naming its agent: all of them, or the first ``per_environment`` of each
    environment; with ``max_output_tokens``, that limit on every model call. Returns agent -> environment."""
    if per_environment is not None and per_environment < 1:
        raise ValueError(f"tasks per environment must be at least 1, not {per_environment}")
    lines = []
    for sources, agent in ENVIRONMENTS.values():
        rows = [line for source in sources for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        for line in rows[:per_environment]:
            if line.strip():
                row = json.loads(line)
                row["agent"] = agent
                if max_output_tokens is not None:
                    row.setdefault("responses_create_params", {})["max_output_tokens"] = max_output_tokens
                lines.append(json.dumps(row, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {agent: env for env, (_, agent) in ENVIRONMENTS.items()}


def demo_stack(
    state_dir: Path,
    *,
    tokens_per_second: float = 150.0,
    latency_s: float = 0.1,
    job_dir: Path | str = ".",
    replicas: int = 1,
    workers: int = 1,
    engine: str = "builtin",
) -> StackConfig:
    """Generation speed and tool latency are real waits, so the checkpoint catches work in flight. The collection
    server reads tasks and writes results only under ``job_dir`` (default: the folder it runs in).

    ``replicas`` runs that many processes of every participant but the collection (which holds the one
    job), ``workers`` that many inference workers behind the policy model.

    ``engine`` ``llama.cpp`` runs llama.cpp's llama-server with the tiny generated model as every inference
    worker (one generation at a time each, so that log-probs do not depend on what runs beside them), which the
    policy model reaches through its ``llama.cpp`` adapter; ``tokens_per_second`` is the built-in worker's."""
    if engine not in WORKER_KINDS:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(WORKER_KINDS)}")
    agents = _agents()
    servers = {
        "inference-worker": _worker(engine, tokens_per_second),
        "policy-model": _policy_model(engine),
        **_environments(latency_s),
        **agents,
        "collection": ServerSpec(
            server="collection",
            config={"agents": {name: f"{{url:{name}}}" for name in agents}, "job_dirs": [str(job_dir)]},
        ),
    }
    for name, spec in servers.items():
        if name == "inference-worker":
            spec.replicas = workers
        elif spec.participant and spec.server not in SINGLE_REPLICA:
            spec.replicas = replicas
    return StackConfig(name="demo", state_dir=str(state_dir), servers=servers)


def _worker(engine: str, tokens_per_second: float) -> ServerSpec:
    """The inference worker: llama.cpp's llama-server with the tiny model, or the built-in scripted one."""
    if engine == "llama.cpp":
        return ServerSpec(server="llama_cpp_worker", participant=False, config={"model": "tiny", "context": 6144})
    worker: dict[str, Any] = {"tokens_per_second": tokens_per_second, "time_to_first_token_s": 0.05}
    return ServerSpec(server="inference_worker", participant=False, config=worker)


def _policy_model(engine: str) -> ServerSpec:
    """Token ids and log-probs on every response (what a trainer reads), sampled with a fixed seed, and every call
    of a rollout in the token ledger (what a trainer freezes; a lost call masks its rollout)."""
    upstream: dict[str, Any] = {"base_url": "{url:inference-worker}/v1", "extra_body": {"seed": SEED}}
    if engine == "llama.cpp":
        upstream["engine"] = "llama.cpp"
    return ServerSpec(
        server="policy_model",
        config={"upstream": upstream, "return_token_id_information": True, "record_tokens": True},
    )


def _environments(latency_s: float) -> dict[str, ServerSpec]:
    """The resources servers of the four environments (and the Lean sandbox stand-in behind one)."""
    return {
        "workplace-assistant": ServerSpec(server="workplace_assistant", config={"tool_latency_s": latency_s}),
        "indirect-prompt-injection": ServerSpec(server="indirect_prompt_injection"),
        "lean-sandbox": ServerSpec(server="lean_sandbox_standin", participant=False),
        "math-formal-lean": ServerSpec(
            server="math_formal_lean",
            config={"sandbox_host": "{host:lean-sandbox}", "sandbox_port": "{port:lean-sandbox}"},
        ),
        "blackjack": ServerSpec(server="blackjack", config={"step_latency_s": latency_s}),
    }


def _agents() -> dict[str, ServerSpec]:
    """One agent per environment, each asking the policy model for the scripted policy that solves its tasks."""
    return {
        "agent-workplace": ServerSpec(
            server="simple_agent",
            config={
                "model_url": "{url:policy-model}",
                "model": "workplace-oracle",
                "resources_url": "{url:workplace-assistant}",
                "max_steps": 12,
            },
        ),
        "agent-ipi": ServerSpec(
            server="simple_agent",
            config={
                "model_url": "{url:policy-model}",
                "model": "ipi-safe",
                "resources_url": "{url:indirect-prompt-injection}",
                "max_steps": 12,
            },
        ),
        "agent-lean": ServerSpec(
            server="proof_refinement_agent",
            config={
                "model_url": "{url:policy-model}",
                "model": "lean-refine",
                "resources_url": "{url:math-formal-lean}",
                "max_correction_turns": 2,
            },
        ),
        "agent-blackjack": ServerSpec(
            server="gymnasium_agent",
            config={
                "model_url": "{url:policy-model}",
                "model": "blackjack-basic",
                "env_url": "{url:blackjack}",
                "max_steps": 10,
            },
        ),
    }
