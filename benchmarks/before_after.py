"""This checkout against an earlier commit, in one run: the checkpoint pause benchmark and the demo, each run on
both code trees in turn (A B, then B A, ...), so a regression shows beside the machine's drift (the runs:
``benchmarks/RESULTS.md``).

The earlier commit's ``services/`` (``--ref``, default ce41d67: the tree before the one pipeline) is extracted into a
temporary folder (cli_checkpoint.py's ``extract``). Both trees run with this venv's Python and the same workload, the
code chosen by ``PYTHONPATH`` (that ``services/`` ahead of the editable install), which every server process inherits:

- the pause benchmark is this checkout's ``benchmarks/checkpoint_pause.py`` (live Workplace sessions, live clients,
  cold and warm checkpoints, a restore into a fresh process), its coordinator and servers from the tree measured;
- the demo is each tree's own ``gymckpt demo`` (its default stack and tasks), read from its report table: the pause
  rollouts saw, the restore, the checkpointed run's wall time, and whether it said OK.

Each figure is the median over ``--rounds``; ``after/before`` is the ratio of the medians.

    .venv/bin/python benchmarks/before_after.py [--ref ce41d67] [--rounds 2] [--sessions 1000] [--storage file s3]
        [--demo-rounds 2] [--skip-pause] [--skip-demo]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cli_checkpoint import extract  # noqa: E402

#: the figures of a pause row compared, and how they print
PAUSE_FIGURES = {
    "pause": ("pause ms", 1e3),
    "worst": ("worst call ms", 1e3),
    "p99_before": ("p99 before ms", 1e3),
    "published": ("published s", 1.0),
    "restore": ("restore s", 1.0),
}
DEMO_PATTERNS = {
    "pause ms": re.compile(r"checkpoint pause seen by rollouts\W+(\d+) ms"),
    "restore ms": re.compile(r"restore into fresh processes\W+(\d+) ms"),
    "checkpointed run s": re.compile(r"wall time uninterrupted / checkpointed\W+[\d.]+ s / ([\d.]+) s"),
    # what the checkpoint held: the trees' demos differ in what they record (token ids, token ledgers)
    "checkpoint records": re.compile(r"checkpoint size\W+[\d.]+ \w+ in (\d+) records"),
    "checkpoint KiB": re.compile(r"checkpoint size\W+([\d.]+ \w+) in"),
}
UNITS = {"B": 1 / 1024, "KB": 1.0, "MB": 1024.0, "GB": 1024.0**2}  # base/text.py human_bytes


def tree_env(services: Path) -> dict[str, str]:
    """The environment that runs the code in ``services``: first on the path (servers inherit it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(services)
    return env


def check_tree(tree: Path) -> None:
    """The interpreter really imports the package in ``tree`` under tree_env (not the editable install's)."""
    out = subprocess.run(
        [sys.executable, "-c", "import gym_services; print(gym_services.__file__)"],
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"PYTHONPATH does not select {tree}: gym_services comes from {out}")


def run_pause(tree: Path, args: argparse.Namespace, out: Path) -> list[dict]:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "checkpoint_pause.py"),
        "--sessions",
        *map(str, args.sessions),
        "--storage",
        *args.storage,
        "--clients",
        str(args.clients),
        "--json",
        str(out),
    ]
    done = subprocess.run(command, env=tree_env(tree), capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"the pause benchmark failed on {tree}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def run_demo(tree: Path, workdir: Path, timeout: float) -> dict[str, float]:
    command = [sys.executable, "-m", "gym_services.cli", "demo", "--workdir", str(workdir), "--quiet"]
    done = subprocess.run(command, env=tree_env(tree), capture_output=True, text=True, timeout=timeout)
    figures: dict[str, float] = {"exit": float(done.returncode)}
    for name, pattern in DEMO_PATTERNS.items():
        match = pattern.search(done.stdout)
        if match and name == "checkpoint KiB":
            number, unit = match.group(1).split()
            figures[name] = float(number) * UNITS.get(unit, float("nan"))
        else:
            figures[name] = float(match.group(1)) if match else float("nan")
    shutil.rmtree(workdir, ignore_errors=True)
    return figures


def ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}" if before else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="ce41d67", help="the earlier commit (default ce41d67)")
    parser.add_argument("--rounds", type=int, default=2, help="pause benchmark runs per tree (default 2)")
    parser.add_argument("--demo-rounds", type=int, default=2, help="demo runs per tree (default 2)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000], help="live sessions (default 1000)")
    parser.add_argument("--storage", nargs="+", choices=["file", "s3"], default=["file", "s3"])
    parser.add_argument("--clients", type=int, default=8, help="live clients (default 8)")
    parser.add_argument("--timeout", type=float, default=1800, help="bound on each run, seconds (default 1800)")
    parser.add_argument("--skip-pause", action="store_true", help="only the demo")
    parser.add_argument("--skip-demo", action="store_true", help="only the pause benchmark")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-before-after-"))
    trees = {"before": extract(args.ref, tmp / "before"), "after": ROOT / "services"}
    try:
        for tree in trees.values():
            check_tree(tree)
        load = [os.getloadavg()[0]]
        pause: dict[str, list[list[dict]]] = defaultdict(list)
        demo: dict[str, list[dict[str, float]]] = defaultdict(list)
        for i in range(0 if args.skip_pause else args.rounds):
            for name in ("after", "before") if i % 2 == 0 else ("before", "after"):
                print(f"pause benchmark, round {i + 1}: {name} ...", file=sys.stderr, flush=True)
                pause[name].append(run_pause(trees[name], args, tmp / f"{name}-{i}.json"))
                load.append(os.getloadavg()[0])
        for i in range(0 if args.skip_demo else args.demo_rounds):
            for name in ("after", "before") if i % 2 == 0 else ("before", "after"):
                print(f"demo, round {i + 1}: {name} ...", file=sys.stderr, flush=True)
                started = time.perf_counter()
                demo[name].append(run_demo(trees[name], tmp / f"demo-{name}-{i}", args.timeout))
                demo[name][-1]["demo s"] = time.perf_counter() - started
                load.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"before = {args.ref}, after = this checkout; medians; machine load {min(load):.1f}-{max(load):.1f}")
    if pause:
        print(f"\ncheckpoint pause benchmark ({args.rounds} runs per tree, {args.clients} live clients)")
        head = f"{'sessions':>8} {'storage':>7} {'start':>5}"
        for label, _ in PAUSE_FIGURES.values():
            head += f" | {label + ' before':>20} {'after':>9} {'ratio':>5}"
        print(head)
        keys = [(r["sessions"], r["storage"], r["start"]) for r in pause["after"][0]]
        for key in keys:
            line = f"{key[0]:>8} {key[1]:>7} {key[2]:>5}"
            for figure, (_, scale) in PAUSE_FIGURES.items():
                values = {
                    name: statistics.median(
                        r[figure] for run in runs for r in run if (r["sessions"], r["storage"], r["start"]) == key
                    )
                    * scale
                    for name, runs in pause.items()
                }
                before, after = values["before"], values["after"]
                line += f" | {before:>20.1f} {after:>9.1f} {ratio(after, before):>5}"
            print(line)
    if demo:
        print(f"\ngymckpt demo ({args.demo_rounds} runs per tree)")
        print(f"{'figure':>20} {'before':>9} {'after':>9} {'ratio':>5}")
        for figure in (
            "pause ms",
            "restore ms",
            "checkpointed run s",
            "demo s",
            "checkpoint records",
            "checkpoint KiB",
        ):
            values = {name: statistics.median(run[figure] for run in runs) for name, runs in demo.items()}
            print(
                f"{figure:>20} {values['before']:>9.1f} {values['after']:>9.1f} "
                f"{ratio(values['after'], values['before']):>5}"
            )
        exits = {name: [int(run["exit"]) for run in runs] for name, runs in demo.items()}
        print(f"{'exit codes':>20} {exits['before']!s:>9} {exits['after']!s:>9}")


if __name__ == "__main__":
    main()
