"""Which llama-server settings make a generation's log-probs independent of what else the server is doing.

The llama.cpp adapter continues a cut generation from its token ids, one token per request; the tests
compare the continuation with the uninterrupted generation token for token and log-prob for log-prob.
The ids never differed, but log-probs moved when several generations ran on one llama-server at once.
This script measures, for the flags ``llama_server_command`` uses and for variants with one of them
changed, the largest log-prob difference between

- each generation run alone on a fresh server (the reference) and
- the same generations all at once on one server (``--concurrency``, several per prompt), and
- each generation continued after a cut at random positions while the others run,

with seeded sampling, and the token ids that differ (target 0). One table; every server a real process
on 127.0.0.1, serving the tiny generated model.

    .venv/bin/python benchmarks/llama_cpp_logprobs.py [--tokens 80] [--concurrency 6] [--variants all]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.llama_cpp import LlamaServer, llama_server_binary, tiny_model  # noqa: E402

from gym_services.base.text import table  # noqa: E402
from gym_services.base.tokens import Tokens  # noqa: E402
from gym_services.models.policy_model.engines import Halt  # noqa: E402
from gym_services.models.policy_model.upstream import Upstream, UpstreamConfig  # noqa: E402

PROMPTS = [
    "Größe und Maß: schreibe über 日本語, Привет and 🙂 🚀 — mit Umlauten.",
    "Cards ♠♥♦♣ and arrows → ← ≤ ≥; café naïve façade.",
    "中文的句子和标点。한국어 문장입니다.",
]
SEED = 1234
#: name -> flags appended to llama_server_command's (llama-server takes the last value of a repeated flag)
VARIANTS: dict[str, list[str]] = {
    "the flags llama_server_command uses": [],
    "4 sequences at once": ["--parallel", "4"],
    "4 sequences at once, micro-batches of 512": ["--parallel", "4", "--ubatch-size", "512"],
    "micro-batches of 512": ["--ubatch-size", "512"],
    "F16 K/V cache": ["--cache-type-k", "f16", "--cache-type-v", "f16"],
    "flash attention on (F16 accumulation)": ["--flash-attn", "on"],
    "no prompt cache in RAM": ["--cache-ram", "0"],
    "2 threads": ["--threads", "2", "--threads-batch", "2"],
}


async def generate(
    url: str, prompt: str, tokens: int, prefix: Tokens | None = None
) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, generated ids, log-probs) of one seeded generation (or its continuation after ``prefix``)."""
    upstream = Upstream(UpstreamConfig(base_url=f"{url}/v1", engine="llama.cpp", extra_body={"seed": SEED}))
    await upstream.start()
    try:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "temperature": 1.0}
        budget = tokens - (len(prefix.generation_token_ids) if prefix else 0)
        request = upstream.engine.request(chat, prefix, budget)
        prompt_ids: list[int] = []
        ids: list[int] = []
        lps: list[float] = []
        async with contextlib.aclosing(upstream.deltas(request, Halt())) as deltas:
            async for delta in deltas:
                if delta.prompt_token_ids is not None:
                    prompt_ids = list(delta.prompt_token_ids)
                ids += delta.generation_token_ids
                lps += delta.generation_log_probs
        if prefix is not None:
            prompt_ids = prompt_ids[: len(prompt_ids) - len(prefix.generation_token_ids)]
        return prompt_ids, ids, lps
    finally:
        await upstream.close()


def compare(got: list[tuple[list[int], list[float]]], want: list[tuple[list[int], list[float]]]) -> tuple[int, float]:
    """(token ids that differ, the largest log-prob difference where the ids agree)."""
    differing, worst = 0, 0.0
    for (ids, lps), (ref_ids, ref_lps) in zip(got, want, strict=True):
        differing += sum(a != b for a, b in zip(ids, ref_ids, strict=False)) + abs(len(ids) - len(ref_ids))
        worst = max([worst, *(abs(a - b) for a, b, x, y in zip(lps, ref_lps, ids, ref_ids, strict=False) if x == y)])
    return differing, worst


async def measure(flags: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    binary, model = llama_server_binary(), tiny_model()
    rng = random.Random(25)
    with tempfile.TemporaryDirectory(dir=work) as folder:
        # the reference: each prompt alone on a fresh server
        alone: dict[str, tuple[list[int], list[int], list[float]]] = {}
        for prompt in PROMPTS:
            server = LlamaServer(binary, model, Path(folder) / f"alone-{len(alone)}", extra=flags)
            try:
                alone[prompt] = await generate(server.url, prompt, args.tokens)
            finally:
                server.stop()
        server = LlamaServer(binary, model, Path(folder) / "busy", extra=flags)
        try:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.concurrency)]
            started = time.perf_counter()
            together = await asyncio.gather(*(generate(server.url, p, args.tokens) for p in prompts))
            elapsed = time.perf_counter() - started
            concurrent = compare([(g[1], g[2]) for g in together], [(alone[p][1], alone[p][2]) for p in prompts])
            # continuations after cuts, all at once, while the uninterrupted generations run again beside them
            cuts = [(p, rng.randrange(1, args.tokens)) for p in prompts]
            continued = await asyncio.gather(
                *(
                    generate(
                        server.url,
                        p,
                        args.tokens,
                        Tokens.of(alone[p][0], alone[p][1][:k], alone[p][2][:k]),
                    )
                    for p, k in cuts
                ),
                *(generate(server.url, p, args.tokens) for p in prompts),
            )
            after_cut = compare(
                [(g[1], g[2]) for g in continued[: len(cuts)]], [(alone[p][1][k:], alone[p][2][k:]) for p, k in cuts]
            )
        finally:
            server.stop()
    return {
        "concurrent_ids": concurrent[0],
        "concurrent_lp": concurrent[1],
        "cut_ids": after_cut[0],
        "cut_lp": after_cut[1],
        "tokens_per_s": args.concurrency * args.tokens / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=80, help="tokens per generation (default 80)")
    parser.add_argument("--concurrency", type=int, default=6, help="generations at once on one server (default 6)")
    parser.add_argument("--variants", default="all", help="comma-separated variant numbers (1-based) or all")
    args = parser.parse_args()
    names = list(VARIANTS)
    if args.variants != "all":
        names = [names[int(i) - 1] for i in args.variants.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llama-logprobs-") as tmp:
        for name in names:
            result = asyncio.run(measure(VARIANTS[name], args, Path(tmp)))
            rows.append(
                [
                    name,
                    " ".join(VARIANTS[name]) or "-",
                    result["concurrent_ids"],
                    f"{result['concurrent_lp']:.1e}",
                    result["cut_ids"],
                    f"{result['cut_lp']:.1e}",
                    f"{result['tokens_per_s']:.0f}",
                ]
            )
            print(f"  {name}: done", file=sys.stderr, flush=True)
    print(
        f"{args.concurrency} seeded generations of {args.tokens} tokens at once on one llama-server "
        "vs each alone on a fresh server; then continued after a random cut each, beside "
        "uninterrupted ones:"
    )
    print(
        table(
            [
                "llama-server",
                "flags added",
                "ids differing (at once)",
                "max |Δ log-prob| (at once)",
                "ids differing (after cuts)",
                "max |Δ log-prob| (after cuts)",
                "tokens/s at once",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
