"""workplace_assistant against NeMo Gym 0.7.0, run longer than CI does; prints a table.

    .venv/bin/python benchmarks/conformance_workplace.py --sequences 2000 --seed 1

Same steps to both sides: the reference's unmodified tool and verifier modules in the oracle
environment (``tests/conformance/oracle``) and our server through its real Starlette routes. Counts
every call whose status or body bytes differ, every final table that differs (columns, dtypes, index,
typed cells) and every verify answer that differs (whole body: the echo and the reward); ``--show N`` prints the first N
differences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance import workplace_assistant_cases as cases  # noqa: E402
from tests.conformance.oracle.client import Oracle  # noqa: E402
from tests.conformance.oracle.reference import oracle_python, reference_root  # noqa: E402

GLUE = "workplace_assistant"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=500, help="random sessions (default 500)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--show", type=int, default=0, help="print the first N differences")
    args = parser.parse_args()

    print("fetching the reference and the oracle environment ...", file=sys.stderr)
    reference = reference_root()
    oracle = Oracle(oracle_python(), reference, timeout_s=600)
    try:
        return asyncio.run(_run(oracle, reference, args))
    finally:
        oracle.close()


async def _run(oracle: Oracle, reference: Path, args) -> int:
    t0 = time.monotonic()
    ids = oracle.call(GLUE, "table_ids")
    groups = {
        "valid call per tool": cases.valid_call_sequences(),
        "invalid args/bodies": cases.invalid_sequences(),
        "random sequences": cases.random_sequences(ids, args.seed, args.sequences),
    }
    rows = []
    content: Counter = Counter()
    shown = 0
    by_tool: Counter = Counter()
    app = cases.make_app()
    for label, sequences in groups.items():
        refs = oracle.call(GLUE, "run_sequences", sequences)
        diff_calls = diff_tables = diff_seqs = 0
        t_ours = time.monotonic()
        for steps, ref in zip(sequences, refs, strict=True):
            ours = await cases.run_ours(app, steps)
            diffs = cases.differences(steps, ref, ours, oracle)
            content[label] += sum(
                1 for a, b in zip(ref["answers"], ours["answers"], strict=False) if not _same_content(a, b)
            )
            if diffs:
                diff_seqs += 1
            for d in diffs:
                if d.startswith("table"):
                    diff_tables += 1
                else:
                    diff_calls += 1
                    by_tool[d.split()[2]] += 1
                if shown < args.show:
                    print(d)
                    shown += 1
        rows.append(
            (label, len(sequences), cases.count_calls(sequences), diff_calls, content[label], diff_tables, diff_seqs)
        )
        print(f"  {label}: done (ours {time.monotonic() - t_ours:.1f} s)", file=sys.stderr)

    data = reference / "resources_servers" / "workplace_assistant" / "data"
    examples = [json.loads(x) for x in (data / "example.jsonl").read_text().splitlines() if x.strip()]
    rollouts = [json.loads(x) for x in (data / "example_rollouts.jsonl").read_text().splitlines() if x.strip()]
    full = cases.reward_cases(examples, rollouts, seed=args.seed)
    vcases = full + cases.partial_verify_cases(full, seed=args.seed) + cases.invalid_verify_cases(full[0])
    ref_answers = oracle.call(GLUE, "verify_answers", [c["body"] for c in vcases])
    verify_diffs = reward_diffs = 0
    for case, ref in zip(vcases, ref_answers, strict=True):
        ours = await cases.verify_ours(app, case)
        if ours != ref:
            verify_diffs += 1
            reward_diffs += _reward(ours) != _reward(ref)
            if shown < args.show:
                print(f"verify {case['name']}:\n  ref  {ref[0]} {ref[1][:400]}\n  ours {ours[0]} {ours[1][:400]}")
                shown += 1

    print()
    print(f"workplace_assistant vs NeMo Gym 0.7.0 (seed {args.seed}, {time.monotonic() - t0:.0f} s)")
    header = (
        "group",
        "sequences",
        "requests compared",
        "differing",
        "in content",
        "tables differing",
        "sequences differing",
    )
    widths = [max(len(h), 20) if i == 0 else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    total = ["total", 0, 0, 0, 0, 0, 0]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
        for i in range(1, 7):
            total[i] += row[i]
    print("  ".join(str(v).ljust(w) for v, w in zip(total, widths, strict=True)))
    print()
    print(
        f"verify requests: {len(vcases)} (full, partial optional fields, invalid); whole answers differing: "
        f"{verify_diffs}, of them in status or reward: {reward_diffs}"
    )
    if by_tool:
        print("differing calls by tool: " + ", ".join(f"{t} {n}" for t, n in by_tool.most_common()))
    return 0 if (total[3] + total[5] + verify_diffs) == 0 else 1


def _reward(answer: list) -> object:
    return (answer[0], json.loads(answer[1])["reward"]) if answer[0] == 200 else (answer[0],)


def _same_content(a: list, b: list) -> bool:
    """Same status and the same JSON value (bytes aside)."""
    if a[0] != b[0]:
        return False
    try:
        return json.loads(a[1]) == json.loads(b[1])
    except ValueError:
        return a[1] == b[1]


if __name__ == "__main__":
    raise SystemExit(main())
