"""What checkpoints write while long generations run: a generation's records in chunks, beside one record rewritten
whole at every checkpoint, in one run.

A reasoning model's call generates thousands of tokens over minutes, so checkpoints every 30 s land many times in
one call. Here 64 generations (a first call each: a 2,048-id prompt, 4 characters of text a token, float32
log-probs) grow by the same number of tokens between two checkpoints until they reach their length; every checkpoint
is captured by the policy model participant's own capture (``participant.captured``), encoded by its encoder and
written by its pack writer to a real ``file://`` store, each referencing the one before (reuse by digest), as the
control plane writes them. Two layouts, the same generations:

- **chunks**: today's records (``prefixes.ChunkCuts``: a chunk per capture of what it wrote since the one before,
  merged only with smaller chunks under ``SEALED_CHUNK_BYTES``); ``--sealed`` runs it again with other bounds (0:
  never merged);
- **whole**: the same records with every generation one chunk, rewritten whole at every checkpoint: what a prefix
  record held before (schema 4: its header, its text, every generated id and log-prob), within a few bytes.

Per row: the bytes the checkpoints wrote from the second on (packs and manifests; the first writes the prompts, the
same in both) over the tokens added since the previous one x 8 bytes (an id and a log-prob), the worst checkpoint's
ratio, and the records a generation has at the end.

    .venv/bin/python benchmarks/generation_chunks.py [--generations 64] [--lengths 1024 4096 16384]
        [--per-checkpoint 30 100 300 900] [--sealed 0 8192]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.records import model_pack_writer, publish_alone  # noqa: E402

from gym_services.base.tokens import Tokens  # noqa: E402
from gym_services.control.packs import ReuseIndex  # noqa: E402
from gym_services.control.participant import Capture, Scope  # noqa: E402
from gym_services.control.protocol import Role  # noqa: E402
from gym_services.control.storage import open_storage  # noqa: E402
from gym_services.control.store import CheckpointStore  # noqa: E402
from gym_services.models.policy_model import prefixes  # noqa: E402
from gym_services.models.policy_model.ledger.rollouts import TokenLedger  # noqa: E402
from gym_services.models.policy_model.participant import MODEL_ENCODER, captured  # noqa: E402
from gym_services.models.policy_model.prefixes import ChunkCuts, StagedPrefix  # noqa: E402

PROMPT = 2048


@dataclass
class Row:
    length: int
    per_checkpoint: int
    layout: str
    checkpoints: int
    written_mb: float
    added_mb: float
    worst: float
    records: float


def generation(rng: random.Random, length: int) -> tuple[list[int], list[int], list[float], str]:
    prompt = [rng.randrange(150_000) for _ in range(PROMPT)]
    generated = [rng.randrange(150_000) for _ in range(length)]
    # float32 values, as engines report them: 4 bytes each in the codec
    log_probs = list(array("f", [-rng.random() * 4 for _ in range(length)]))
    text = "".join(rng.choice("abcdefghij ") for _ in range(4 * length))
    return prompt, generated, log_probs, text


def run(layout: str, length: int, step: int, generations: int, folder: Path) -> Row:
    """``layout``: ``whole``, or ``chunks`` followed by its sealed bound."""
    rng = random.Random(7)
    calls = [generation(rng, length) for _ in range(generations)]
    cuts = [ChunkCuts() for _ in calls]
    store = CheckpointStore(open_storage(f"file://{folder}"))
    reuse: list[ReuseIndex] = []
    written = added = 0
    worst = 0.0
    ends = list(range(step, length + 1, step))
    last_records = 0
    with ThreadPoolExecutor(2) as pool:
        for n, end in enumerate(ends):
            generations_now = []
            for i, (prompt, generated, log_probs, text) in enumerate(calls):
                tokens = Tokens(prompt, tuple(generated[:end]), tuple(log_probs[:end]))
                chunks = cuts[i].cut((end, 4 * end), True) if layout != "whole" else ()
                prefix = StagedPrefix(0, text[: 4 * end], False, None, PROMPT, end, tokens, chunks)
                generations_now.append(((f"r{i}", f"{i:064x}"), prefix))
            records = captured(TokenLedger(), generations_now, Scope())
            checkpoint = f"ck-{n}"
            store.claim(checkpoint, f"tx-{checkpoint}", "bench", ["policy-model"])
            result = model_pack_writer(pool, MODEL_ENCODER).write(store, Capture(records), checkpoint, reuse[-1:])
            publish_alone(store, checkpoint, result, "policy-model", Role.MODEL)
            reuse.append(result.index)
            last_records = result.records
            if n:
                new_tokens = generations * step
                written += result.written_bytes
                added += 8 * new_tokens
                worst = max(worst, result.written_bytes / (8 * new_tokens))
    return Row(length, step, layout, len(ends), written / 2**20, added / 2**20, worst, last_records / generations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--per-checkpoint", type=int, nargs="+", default=[30, 100, 300, 900])
    parser.add_argument(
        "--sealed", type=int, nargs="*", default=[0], help="other SEALED_CHUNK_BYTES to run the chunks with"
    )
    args = parser.parse_args()
    today = prefixes.SEALED_CHUNK_BYTES
    bounds = [today, *(b for b in args.sealed if b != today)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymckpt-generation-chunks-") as tmp:
        for length in args.lengths:
            for step in args.per_checkpoint:
                if not 2 <= length // step <= 100:
                    continue
                for layout in [*(f"chunks {b}" for b in bounds), "whole"]:
                    folder = Path(tmp) / f"{layout.replace(' ', '-')}-{length}-{step}"
                    if layout != "whole":
                        prefixes.SEALED_CHUNK_BYTES = int(layout.split()[1])
                    rows.append(run(layout, length, step, args.generations, folder))
                    prefixes.SEALED_CHUNK_BYTES = today
                    r = rows[-1]
                    print(f"  {length} tokens, {step} a checkpoint, {layout}: {r.written_mb:.1f} MB", file=sys.stderr)
    print(
        f"{args.generations} generations, a {PROMPT}-id first prompt each; written from the second checkpoint on "
        "(packs and manifests) over the tokens added x 8 bytes"
    )
    names = [f"chunks sealed at {b}" + (" (today)" if b == today else "") for b in bounds] + ["whole"]
    print(f"layouts, in this order: {'; '.join(names)}")
    print(
        "| generation tokens | tokens a checkpoint | checkpoints | added MB | written MB | written / added "
        "| worst checkpoint | records a generation |"
    )
    print("|---|---|---|---|---|---|---|---|")
    width = len(names)
    for i in range(0, len(rows), width):
        group = rows[i : i + width]
        first = group[0]
        print(
            f"| {first.length} | {first.per_checkpoint} | {first.checkpoints} | {first.added_mb:.1f} | "
            + " / ".join(f"{r.written_mb:.1f}" for r in group)
            + " | "
            + " / ".join(f"{r.written_mb / r.added_mb:.2f}" for r in group)
            + " | "
            + " / ".join(f"{r.worst:.2f}" for r in group)
            + " | "
            + " / ".join(f"{r.records:.0f}" for r in group)
            + " |"
        )


if __name__ == "__main__":
    main()
