"""indirect_prompt_injection against NeMo Gym 0.7.0, run longer than CI does; prints a table.

    .venv/bin/python benchmarks/conformance_ipi.py --sequences 2000 --seed 1

The same HTTP steps go to both sides: NeMo Gym's unmodified app, tool and verifier modules in the
oracle environment (``tests/conformance/oracle``) and our server through its real Starlette routes.
Every step compares status, body bytes and content type, and the session's environment after the
step; every verify step also compares the rewards on their own. Groups: every tool with valid
arguments (in each domain that offers it), invalid arguments and bodies, seeded random sequences of
2-8 calls over all nine domains, and verify requests (the example tasks and each domain's
injections with perturbed predictions, posted with only some optional Responses API fields; the
whole verify answer is compared). Deliberate differences (``ipi_allowed.py``) are counted
apart. ``--show N`` prints the first N differences.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance.ipi_allowed import allowed  # noqa: E402
from tests.conformance.ipi_ours import GLUE, Tally, compare, run_ours  # noqa: E402
from tests.conformance.ipi_run import groups  # noqa: E402
from tests.conformance.oracle.client import Oracle  # noqa: E402
from tests.conformance.oracle.reference import oracle_python, reference_root  # noqa: E402

CHUNK = 50  # sequences per oracle round trip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=500, help="random sessions (default 500)")
    parser.add_argument("--verify", type=int, default=300, help="verify requests (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--show", type=int, default=0, help="print the first N differences")
    args = parser.parse_args()

    print("fetching the reference and the oracle environment ...", file=sys.stderr)
    oracle = Oracle(oracle_python(), reference_root(), timeout_s=600)
    try:
        return asyncio.run(_run(oracle, args))
    finally:
        oracle.close()


async def _run(oracle: Oracle, args) -> int:
    t0 = time.monotonic()
    total = Tally()
    rows = []
    for label, sequences in groups(args.seed, args.sequences, args.verify).items():
        tally = Tally()
        for start in range(0, len(sequences), CHUNK):
            chunk = sequences[start : start + CHUNK]
            for steps, ref in zip(chunk, oracle.call(GLUE, "run_many", chunk), strict=True):
                tally.add(compare(steps, await run_ours(steps), ref, allowed=allowed, keep=args.show))
            done = start + len(chunk)
            print(f"\r{label}: {done}/{len(sequences)}", end="" if sys.stderr.isatty() else "\n", file=sys.stderr)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        rows.append((label, tally))
        total.add(tally)
    rows.append(("total", total))

    reference_tools = {t for names in oracle.call(GLUE, "tool_names").values() for t in names}
    print(f"indirect_prompt_injection vs NeMo Gym 0.7.0 (seed {args.seed}, {time.monotonic() - t0:.0f} s)\n")
    header = (
        "group",
        "tools",
        "sequences",
        "calls compared",
        "reward checks",
        "calls differing",
        "answer diffs",
        "state diffs",
        "reward diffs",
        "allowed",
    )
    table = [header]
    for label, t in rows:
        allowed_n = sum(n for k, n in t.kinds.items() if k.startswith("allowed: "))
        table.append(
            (
                label,
                str(len(t.tools & reference_tools)),
                str(t.sequences),
                str(t.calls),
                str(t.reward_checks),
                str(t.differing_steps),
                str(t.call_diffs),
                str(t.state_diffs),
                str(t.reward_diffs),
                str(allowed_n),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for n, r in enumerate(table):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\nreference tools: {len(reference_tools)}; called: {len(total.tools & reference_tools)}")
    print(
        "calls differing: status, body bytes, content type or the session's environment afterwards differ "
        "(answer diffs + state diffs, a call counted once); allowed: deliberate differences (ipi_allowed.py)"
    )
    if total.kinds:
        print("\ndifferences by kind:")
        for kind, n in total.kinds.most_common():
            print(f"  {n:6d}  {kind}")
    for example in total.examples[: args.show]:
        print("\n" + example)
    return 0 if total.differences == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
