"""Agents against NeMo Gym 0.7.0: every scenario of tests/conformance/agents_cases.py through both, counted.

    .venv/bin/python benchmarks/conformance_agents.py [--details] [--case NAME]

Prints, per agent: scenarios, model requests compared and how many have equal bodies (items, order,
function-call output text, parameters), environment requests compared, /run answers equal, and the
differences found (all, and those outside the test suite's allow-list). ``--model NAME`` measures
agents that need a configured model name (those before the conformance work).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.agents_cases import all_cases
from tests.conformance.agents_compare import compare, reference, run_ours
from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.reference import oracle_python, reference_root


def allowed_list():
    try:
        from tests.conformance.test_agents_conformance import ALLOWED
    except ImportError:
        return []
    return ALLOWED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--details", action="store_true", help="print every difference")
    parser.add_argument("--case", help="only scenarios whose name contains this")
    parser.add_argument("--model", help="configure our agents with this model name (older agents needed one)")
    args = parser.parse_args()
    allowed = allowed_list()
    oracle = Oracle(oracle_python(), reference_root())
    rows: dict[str, Counter] = {}
    details: list[str] = []
    try:
        for index, case in enumerate(all_cases(reference_root())):
            if args.case and args.case not in case["name"]:
                continue
            ref = reference(oracle, case, index)
            ours = asyncio.run(run_ours(case, index, **({"model": args.model} if args.model else {})))
            diffs = compare(case, ref, ours)
            c = rows.setdefault(case["kind"], Counter())
            c["scenarios"] += 1
            c["model requests"] += max(len(ref["model_requests"]), len(ours["model_requests"]))
            c["model bodies equal"] += sum(
                1
                for d in range(max(len(ref["model_requests"]), len(ours["model_requests"])))
                if not any(
                    x.area in ("model_request", "model_requests")
                    and (x.where == "paths" or (x.where.startswith(f"[{d}]") and not x.where.endswith("cookies")))
                    for x in diffs
                )
            )
            c["env requests"] += max(len(ref["env_requests"]), len(ours["env_requests"]))
            c["run answers equal"] += int(not any(x.area.startswith("run_") for x in diffs))
            c["differences"] += len(diffs)
            unexplained = [d for d in diffs if not any(a.covers(d) for a in allowed)]
            c["unexplained"] += len(unexplained)
            details += [("  " if d not in unexplained else "! ") + str(d) for d in diffs]
    finally:
        oracle.close()
    cols = [
        "scenarios",
        "model requests",
        "model bodies equal",
        "env requests",
        "run answers equal",
        "differences",
        "unexplained",
    ]
    print(f"{'agent':<24}" + "".join(f"{c:>20}" for c in cols))
    for kind, c in rows.items():
        print(f"{kind:<24}" + "".join(f"{c[k]:>20}" for k in cols))
    if args.details:
        print("\n".join(details))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
