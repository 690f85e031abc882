"""Differential run of our blackjack and math_formal_lean servers against NeMo Gym 0.7.0's own apps.

    .venv/bin/python benchmarks/conformance_blackjack_lean.py [--games 2000] [--verifications 1000] [--seed 0]

The reference apps run unmodified in the oracle environment (``tests/conformance/oracle``); ours run
through their real Starlette routes in process. Same calls to both; status codes and response
bytes compared. Prints one table per server: calls compared, sequences/games, reward checks,
differences (and the deliberate ones, allow-listed in ``tests/conformance/*_allow.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance import blackjack_cases, lean_cases
from tests.conformance.http_cases import Tally, run_sequences
from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.reference import oracle_python, reference_root
from tests.conformance.test_blackjack_conformance import blackjack_allowed, our_blackjack
from tests.conformance.test_lean_conformance import lean_allowed
from tests.conformance.test_lean_conformance import run_ours as run_lean


def reward_checks(
    tally: Tally, sequences: list[dict[str, Any]], ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str
) -> tuple[int, int]:
    """(checks, differing): answers of both sides that carry a reward, and how many rewards differ."""

    checks = differing = 0
    for mine, ref in zip(ours, theirs, strict=True):
        for a, b in zip(mine["answers"], ref["answers"], strict=False):
            ra = _reward(a, key)
            rb = _reward(b, key)
            if ra is None and rb is None:
                continue
            checks += 1
            differing += ra != rb
    return checks, differing


def _reward(answer: dict[str, Any], key: str) -> Any:
    import json

    if answer["status"] != 200:
        return None
    try:
        body = json.loads(answer["body"])
    except ValueError:
        return None
    return body.get(key) if isinstance(body, dict) else None


GROUPS: list[tuple[str, str, Tally]] = []  # (server, group, its own tally), for the per-group table
NO_ALLOW = False


def _allow(rule):
    return (lambda call, ours, theirs: None) if NO_ALLOW else rule


async def blackjack(oracle: Oracle, games: int, seed: int) -> dict[str, Any]:
    tally = Tally()
    groups = {
        "random games": blackjack_cases.random_games(games, seed),
        "every path": blackjack_cases.every_path_games(),
        "invalid bodies": [s for _, s in blackjack_cases.invalid_sequences()],
    }
    checks = differing = 0
    game_count = 0
    async with our_blackjack() as app:
        for name, sequences in groups.items():
            theirs = oracle.call("blackjack", "run_sequences", sequences)
            ours = await run_sequences(app, sequences)
            tally.compare(name, sequences, ours, theirs, _allow(blackjack_allowed))
            group = Tally()
            group.compare(name, sequences, ours, theirs, _allow(blackjack_allowed))
            GROUPS.append(("blackjack", name, group))
            c, d = reward_checks(tally, sequences, ours, theirs, "reward")
            checks, differing = checks + c, differing + d
            game_count += len(sequences)
    return {"tally": tally, "games": game_count, "reward_checks": checks, "reward_differences": differing}


async def lean(oracle: Oracle, count: int, seed: int) -> dict[str, Any]:
    tally = Tally()
    groups = {
        "recorded verifications": lean_cases.recorded_sequences(reference_root()),
        "example tasks + perturbed": lean_cases.verification_sequences(count, seed),
        "sandbox answers": lean_cases.sandbox_answer_sequences(),
        "invalid bodies": lean_cases.invalid_sequences(),
    }
    checks = differing = 0
    total = 0
    for name, sequences in groups.items():
        theirs = oracle.call("math_formal_lean", "run_sequences", sequences)
        ours = await run_lean(sequences)
        tally.compare(name, sequences, ours, theirs, _allow(lean_allowed))
        group = Tally()
        group.compare(name, sequences, ours, theirs, _allow(lean_allowed))
        GROUPS.append(("math_formal_lean", name, group))
        c, d = reward_checks(tally, sequences, ours, theirs, "reward")
        checks, differing = checks + c, differing + d
        total += len(sequences)
    return {"tally": tally, "games": total, "reward_checks": checks, "reward_differences": differing}


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    head = (
        "server",
        "calls compared",
        "sequences",
        "equal sequences",
        "reward checks",
        "reward diffs",
        "differences",
        "allowed",
    )
    lines = [head]
    for name, r in rows:
        t: Tally = r["tally"]
        lines.append(
            (
                name,
                str(t.calls),
                str(r["games"]),
                str(t.equal_sequences),
                str(r["reward_checks"]),
                str(r["reward_differences"]),
                str(len(t.differences)),
                str(len(t.allowed)),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def group_table() -> str:
    head = ("server", "group", "calls", "sequences", "equal sequences", "differences", "allowed")
    lines = [head] + [
        (
            server,
            name,
            str(t.calls),
            str(t.sequences),
            str(t.equal_sequences),
            str(len(t.differences)),
            str(len(t.allowed)),
        )
        for server, name, t in GROUPS
    ]
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=2000, help="random blackjack games (default 2000)")
    parser.add_argument("--verifications", type=int, default=600, help="perturbed Lean verifications (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random games and perturbations (default 0)")
    parser.add_argument(
        "--only", choices=("blackjack", "math_formal_lean"), default=None, help="compare one server only (default both)"
    )
    parser.add_argument("--show", type=int, default=3, help="differences to print per server")
    parser.add_argument("--no-allow", action="store_true", help="count allow-listed differences as differences")
    args = parser.parse_args()
    global NO_ALLOW
    NO_ALLOW = args.no_allow
    print("building the oracle (first run downloads the NeMo Gym wheel) ...", file=sys.stderr)
    oracle = Oracle(oracle_python(), reference_root())
    rows = []
    try:
        started = time.monotonic()
        if args.only in (None, "blackjack"):
            rows.append(("blackjack", await blackjack(oracle, args.games, args.seed)))
        if args.only in (None, "math_formal_lean"):
            rows.append(("math_formal_lean", await lean(oracle, args.verifications, args.seed)))
        elapsed = time.monotonic() - started
    finally:
        oracle.close()
    print(table(rows))
    print()
    print(group_table())
    print(f"\n{elapsed:.1f} s")
    for name, r in rows:
        t: Tally = r["tally"]
        if t.allowed:
            kinds: dict[str, int] = {}
            for a in t.allowed:
                kinds[a["allowed"]] = kinds.get(a["allowed"], 0) + 1
            print(f"\n{name}: allowed differences (the allow-lists in tests/conformance/test_*_conformance.py):")
            for kind, n in sorted(kinds.items()):
                print(f"  {n:5d}  {kind}")
        if t.differences:
            print(f"\n{name}: first differences:")
            print(t.summary(args.show))
    return 1 if any(r["tally"].differences for _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
