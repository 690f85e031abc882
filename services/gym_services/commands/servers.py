"""``gymckpt servers``: every server ``gymckpt serve`` and a stack YAML can name, and where each comes from."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_servers(args: argparse.Namespace) -> int:
    from gym_services.base.text import table
    from gym_services.server.sources import ENTRY_POINT_GROUP, UnknownServer, installed, load

    sources, skipped = installed()
    problems: dict[str, str] = {}
    if args.check:
        for source in sources:
            try:
                load(source.name)
            except UnknownServer as exc:
                problems[source.name] = str(exc)
            except Exception as exc:  # an installed package that fails while importing: say so, keep listing
                problems[source.name] = f"importing {source.module} failed: {type(exc).__name__}: {exc}"
    if args.json:
        rows = [
            {
                "name": s.name,
                "origin": str(s.origin),
                "distribution": s.distribution,
                "target": s.target,
                **({"error": problems.get(s.name)} if args.check else {}),
            }
            for s in sources
        ]
        skipped_rows = [vars(s) for s in skipped]
        print(json.dumps({"servers": rows, "skipped": skipped_rows}, indent=1))
        return 1 if problems else 0
    header = ["name", "from", "target"] + (["check"] if args.check else [])
    lines = [[s.name, s.describe(), s.target] + ([problems.get(s.name, "ok")] if args.check else []) for s in sources]
    print(table(header, lines))
    for skip in skipped:
        print(f"skipped: {skip.name} = {skip.target} ({skip.distribution}): {skip.reason}", file=sys.stderr)
    print(
        f"\nA package registers a server as an entry point of the {ENTRY_POINT_GROUP!r} group; any server can also be "
        "named by import path (my_pkg.my_env:create_app). docs/authoring.md shows both."
    )
    return 1 if problems else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "servers",
        help="list the servers that can be served, and where each comes from",
        description="List every server `gymckpt serve` and a stack YAML's `server:` can name: the ones shipped with "
        "gym-checkpoint and the ones installed packages register (entry points). --check imports each.",
    )
    p.add_argument("--check", action="store_true", help="import each server; exit 1 if one cannot be loaded")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_servers)
