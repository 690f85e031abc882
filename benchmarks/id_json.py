"""What writing a long context's token ids as JSON costs the policy model, per call: ``json.dumps`` against
``base/id_json.py`` in one run.

Every call the policy model answers is written as JSON (Starlette's ``JSONResponse``: ``json.dumps``) with its output
item's ``prompt_token_ids``, the whole prompt, and its request digest is the sha256 of the request's canonical JSON,
which holds every earlier item's ids carried back. A profile of the model serving 4,096 live rollouts at 8k contexts
put a third of its event loop there (``benchmarks/RESULTS.md``, "Where the policy model's event loop goes").
``id_json.dumps`` writes the same bytes (checked here for every case) with the id lists written by pydantic-core.

Per context length: a response as the model builds it (a message with the prompt's ids, 64 generated ids and their
log-probs, the task's tools echoed: ``token_scale.py``'s padded tools for that context) and a request carrying back
``--turns`` earlier items, each written ``--repeats`` times; the median of ``--rounds`` rounds, milliseconds a call.

    .venv/bin/python benchmarks/id_json.py [--contexts 8192 32768] [--turns 3] [--repeats 50] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shapes(context: int, turns: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A response and a request of a rollout at ``context`` tokens (ids drawn from a 151k vocabulary)."""
    from benchmarks.token_scale import write_tasks

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.jsonl"
        write_tasks(path, 1, context)
        row = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    params = row["responses_create_params"]
    rng = random.Random(context)
    ids = [rng.randrange(0, 151_000) for _ in range(context)]
    log_probs = [-rng.random() * 4 for _ in range(64)] + [-1e-05]
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "done " * 20, "annotations": []}],
        "prompt_token_ids": ids,
        "generation_token_ids": ids[:65],
        "generation_log_probs": log_probs,
    }
    response = {"id": "resp", "object": "response", "output": [item], "tools": params.get("tools", [])}
    earlier = [{**item, "prompt_token_ids": ids[: context * (k + 1) // (turns + 1)]} for k in range(turns)]
    request = {"model": "m", "input": [*params.get("input", []), *earlier], "tools": params.get("tools", [])}
    return response, request


def per_call_ms(write: Callable[[], bytes], repeats: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            write()
        times.append((time.perf_counter() - started) / repeats * 1e3)
    return statistics.median(times)


def main() -> None:
    from gym_services.base import id_json
    from gym_services.control.records import canonical_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    def reference(value: Any) -> bytes:  # Starlette's JSONResponse
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()

    print("| context | what | bytes | json.dumps ms | id_json ms | after / before | same bytes |")
    print("|---|---|---|---|---|---|---|")
    for context in args.contexts:
        response, request = shapes(context, args.turns)
        cases: list[tuple[str, Callable[[], bytes], Callable[[], bytes]]] = [
            (
                "response",
                lambda r=response: reference(r),  # type: ignore[misc]
                lambda r=response: id_json.dumps(r, "output", allow_nan=False),  # type: ignore[misc]
            ),
            (
                f"request digest ({args.turns} earlier items)",
                lambda q=request: hashlib.sha256(canonical_json(q)).digest(),  # type: ignore[misc]
                lambda q=request: hashlib.sha256(id_json.dumps(q, "input", sort_keys=True)).digest(),  # type: ignore[misc]
            ),
        ]
        for name, before, after in cases:
            same = before() == after()
            size = len(reference(response) if name == "response" else canonical_json(request))
            b, a = (per_call_ms(f, args.repeats, args.rounds) for f in (before, after))
            print(f"| {context} | {name} | {size:,} | {b:.2f} | {a:.2f} | {a / b:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
