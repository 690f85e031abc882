"""``gymckpt new-server NAME``: write a package with a server that takes part in checkpoints (``docs/authoring.md``)."""

from __future__ import annotations

import argparse
import sys


def cmd_new_server(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gym_services.authoring.template import TemplateError, new_server

    parent = Path(args.dir)
    try:
        written = new_server(args.name, parent)
    except TemplateError as exc:
        print(f"gymckpt new-server: {exc}", file=sys.stderr)
        return 2
    root = parent / args.name
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nnext: cd {root} && pip install -e '.[test]' && gymckpt check-server {args.name} --episodes episodes.yaml"
        "\n(docs/authoring.md walks through the server it wrote)"
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "new-server",
        help="write a package with a server that takes part in checkpoints, its README and tests",
        description="Write NAME/ (a Python package): a small stateful server (a key-value notebook) with its "
        "session hooks, a README, tests, the episodes `gymckpt check-server` runs and a stack YAML. It registers "
        "the server under NAME as an entry point, so `pip install -e NAME` makes `gymckpt serve NAME` work.",
    )
    p.add_argument("name", help="the package's name: lower-case letters, digits and _")
    p.add_argument("--dir", default=".", help="the folder to write NAME/ into (default: here)")
    p.set_defaults(func=cmd_new_server)
