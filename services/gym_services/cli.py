"""The ``gymckpt`` command: serve one server, run a local stack, checkpoint and restore it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

Command = Callable[[argparse.Namespace], int]


def _serve(args: argparse.Namespace) -> int:
    from gym_services.base.config import ConfigError
    from gym_services.server.serve import run
    from gym_services.server.sources import UnknownServer

    try:
        run(
            args.server,
            args.config,
            args.host,
            args.port,
            args.control_port,
            args.drain_timeout,
            args.fd,
            args.termination_grace,
        )
    except (ConfigError, UnknownServer) as exc:
        print(f"gymckpt serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gym-checkpoint")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gymckpt",
        description="Partial-rollout checkpointing for Gym servers: serve, run a local stack, checkpoint, restore.",
    )
    parser.add_argument("--version", action="version", version=f"gymckpt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run one Gym server (uvicorn) from its config",
        description="Run one Gym server. Config comes from --config (YAML), then GYMCKPT_* environment "
        "variables (GYMCKPT_CONTROL_TOKEN, GYMCKPT_SESSION_SECRET, GYMCKPT_PARTICIPANT_ID, GYMCKPT__A__B), "
        "then --host/--port.",
    )
    serve.add_argument(
        "server",
        metavar="SERVER",
        help="a server's name (`gymckpt servers` lists them) or an import path: my_pkg.my_env:create_app",
    )
    serve.add_argument("--config", help="YAML config file")
    serve.add_argument("--host", help="bind address (default from config, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default from config)")
    serve.add_argument(
        "--control-port",
        type=int,
        help="serve the checkpoint control routes on this port only "
        "(and the data routes only on --port), so a NetworkPolicy can fence the control plane off",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="when the server exits, let requests in flight finish for this long (default 2)",
    )
    serve.add_argument(
        "--termination-grace",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, keep serving and holding state this long so the stack can take a final checkpoint "
        "(exit once this server's part is persisted); 0: drain and exit at once (default: the config's "
        "checkpoint.termination_grace_s, 0). A first SIGINT always stops at once",
    )
    serve.add_argument(
        "--fd",
        type=int,
        metavar="N",
        help="serve on the listening socket inherited as file descriptor "
        "N (bound by a launcher, so no other process can take its port first)",
    )
    serve.set_defaults(func=_serve)

    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    """Commands that live in their own modules (local stack, checkpoints, demo)."""
    from gym_services import commands

    return commands.REGISTRARS


#: the exit status of a process ended by SIGPIPE, what `cmd | head` expects of a writer it stopped reading
EXIT_BROKEN_PIPE = 128 + 13


#: the exit status of a command stopped by Ctrl-C (SIGINT), as shells report it (not imported from
#: gym_services.commands.output: importing that package is what a Ctrl-C while starting interrupts)
EXIT_INTERRUPTED = 128 + 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        _forget_caught_interrupts()


def _forget_caught_interrupts() -> None:
    """Keep a Ctrl-C this process caught and reported from ending it by SIGINT after all (exit -2, not ours).

    CPython marks a KeyboardInterrupt that ends the evaluation of source *text* (``exec``/``eval`` of a
    string, as dataclasses and namedtuples do while modules import) as unhandled even when a caller
    catches it, and under ``python -m`` it then kills itself with SIGINT on the way out instead of
    exiting with the status the command returned. The mark is reset when the next string evaluation
    starts, so evaluating one that ends normally clears it.
    """
    eval("None")  # a constant, evaluated only for the side effect above


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser = build_parser()  # imports every command's modules: seconds on a loaded machine
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("\ngymckpt: interrupted while starting; nothing was done", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # whoever read our output stopped (`gymckpt ... | head`): stop quietly, and keep the
        # interpreter's final flush from failing on the closed pipe too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # a command with nothing left running to report on
        print(f"\ngymckpt {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
