"""``gymckpt check-server``: the conformance harness against an author's own server (``docs/authoring.md``)."""

from __future__ import annotations

import argparse
import sys


def cmd_check_server(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import tempfile
    from pathlib import Path

    import yaml

    from gym_services.authoring.episodes import load_episodes
    from gym_services.authoring.harness import check_server, new_secrets
    from gym_services.authoring.processes import Launch, ServerFailed
    from gym_services.base.config import ConfigError
    from gym_services.server.sources import UnknownServer, check

    try:
        check(args.server) if args.python is None else None  # another interpreter finds its own modules
        episodes = load_episodes(args.episodes)
        config = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
    except (ConfigError, UnknownServer, OSError, yaml.YAMLError) as exc:
        print(f"gymckpt check-server: {exc}", file=sys.stderr)
        return 2
    if not isinstance(config, dict):
        print(f"gymckpt check-server: {args.config} must be a mapping of config fields", file=sys.stderr)
        return 2
    token, secret = new_secrets()
    with tempfile.TemporaryDirectory(prefix="gymckpt-check-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        launch = Launch(
            server=args.server,
            config=config,
            workdir=workdir,
            participant_id="under-check",
            control_token=token,
            session_secret=secret,
            python=args.python or sys.executable,
            ready_timeout_s=args.timeout,
        )
        say = None if args.json else (lambda text: print(f"  {text}", file=sys.stderr, flush=True))
        try:
            report = asyncio.run(check_server(launch, episodes, rounds=args.rounds, seed=args.seed, say=say))
        except ServerFailed as exc:
            print(f"gymckpt check-server: {exc}", file=sys.stderr)
            return 1
    if args.json:
        checks = [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in report.checks]
        print(json.dumps({"server": report.server, "mode": report.mode, "ok": report.ok, "checks": checks}, indent=1))
    else:
        print(report.text())
    return 0 if report.ok else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-server",
        help="check that a server keeps the checkpoint contract (checkpoint, SIGKILL, restore, compare)",
        description="Run the episodes of EPISODES against SERVER in fresh processes: once uninterrupted, then "
        "--rounds times with a checkpoint at a random call, a SIGKILL a few calls later and a restore into a fresh "
        "process; every answer after the restore must equal the uninterrupted run's, a late call of the old attempt "
        "must be refused with and without identity headers, and the declared checkpoint_mode must match what the "
        "server holds. Exits 0 when every check passes, 1 when one fails.",
    )
    p.add_argument("server", help="a server's name (`gymckpt servers`) or an import path: my_pkg.my_env:create_app")
    p.add_argument("--episodes", required=True, help="YAML/JSON file: the calls of each episode (docs/authoring.md)")
    p.add_argument("--config", help="YAML file: the server's config fields")
    p.add_argument("--rounds", type=int, default=3, help="checkpoints at random calls, each restored (default 3)")
    p.add_argument("--seed", type=int, default=0, help="draws the interleaving and the checkpoint calls (default 0)")
    p.add_argument("--python", help="the interpreter that serves it (default this one): a venv of the server's own")
    p.add_argument("--workdir", help="keep configs, logs and checkpoints here (default a temporary folder)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a process may take to be ready (default 60)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check_server)
