"""``gymckpt collect``: start a collection job (or attach to the running one), follow it, report rewards.

The collection server is the local stack's, or a remote one given by --url (on Kubernetes, reached through
``kubectl port-forward``): the tasks file is uploaded to it, and the results are downloaded to --output when the
job completes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_services.commands.output import EXIT_INTERRUPTED
from gym_services.commands.stack.follow import follow
from gym_services.commands.stack.job_files import check_tasks_file, refuse_overwrite, reward_table
from gym_services.commands.stack.jobs import CollectError, attach, download_results, local_job_token, start_job
from gym_services.commands.stack.running import fail, plural, running, state_dir, stopped
from gym_services.stack.launcher import StackError, read_state

REMOTE_TOKEN_MISSING = (
    "a remote collection server needs its job token: set GYMCKPT_JOB_TOKEN (the chart's collection "
    "server takes the control token: kubectl get secret RELEASE-gym-checkpoint-generated "
    "-o jsonpath='{.data.token}' | base64 -d)"
)


@dataclass
class Server:
    """The collection server a command talks to, and the token its job routes take."""

    url: str
    token: str
    remote: bool

    def attach_command(self) -> str:
        return f"`gymckpt collect --attach{' --url ' + self.url if self.remote else ''}`"


def _server(args: argparse.Namespace) -> Server:
    """--url with the token from the environment, else the local stack's collection server."""
    if args.url:
        token = os.environ.get("GYMCKPT_JOB_TOKEN") or os.environ.get("GYMCKPT_CONTROL_TOKEN")
        if not token:
            raise CollectError(REMOTE_TOKEN_MISSING)
        return Server(args.url.rstrip("/"), token, remote=True)
    try:
        state = running(args)
        url = state.url(args.collection)
        if args.collection in stopped(state):
            raise StackError(
                f"the collection server {args.collection} is not running; `gymckpt up CONFIG` starts it again"
            )
        return Server(url, local_job_token(args, state), remote=False)
    except KeyError as exc:
        raise StackError(str(exc)) from None


def cmd_collect(args: argparse.Namespace) -> int:
    """Start a job (or --attach to the running one), follow it, and report rewards."""
    if args.attach == bool(args.tasks):
        return fail("collect", RuntimeError("give a tasks JSONL to start a job, or --attach to follow the running one"))
    try:
        server = _server(args)
        if args.tasks:
            check_tasks_file(Path(args.tasks), args.limit)
        if args.resume and (args.url or args.attach):
            raise CollectError("--resume starts a job on a local stack's results file: give TASKS, without --url")
        if (args.url or not args.attach) and not args.resume:  # the results file this command (or its job) writes
            refuse_overwrite(Path(args.output), args.overwrite)
    except (CollectError, StackError) as exc:
        return fail("collect", exc)
    import httpx

    status: dict[str, Any] | None = None
    try:
        with httpx.Client(
            timeout=args.timeout, trust_env=False, headers={"authorization": f"Bearer {server.token}"}
        ) as http:
            status = attach(http, server.url) if args.attach else start_job(http, server.url, args, server.remote)
            if args.no_wait:
                print(f"collecting {status['total']} rollouts on {server.url}; follow with {server.attach_command()}")
                return 0
            if status.get("kept"):
                print(
                    f"collect: resumed {args.output}: {status['kept']} results kept, "
                    f"{status['total'] - status['kept']} to run",
                    file=sys.stderr,
                )
            status = follow(
                http,
                server.url,
                status,
                args.wait_timeout,
                args.stall_warning,
                _missing(args, server),
                None if server.remote else lambda: _relocate(args),
            )
            results = Path(args.output) if server.remote else Path(status["output_path"])
            if server.remote:
                download_results(http, server.url, results)
    except (CollectError, httpx.HTTPError, OSError) as exc:
        return fail("collect", exc)
    except KeyboardInterrupt:
        return _interrupted(server, started=status is not None)
    return _report(args, status, results)


def _relocate(args: argparse.Namespace) -> str | None:
    """The local collection server's URL now (a stack started again has new ports); None while it is not running."""
    try:
        state = read_state(state_dir(args))
        url = state.url(args.collection)
    except (StackError, KeyError):
        return None
    return None if args.collection in stopped(state) else url


def _missing(args: argparse.Namespace, server: Server) -> Callable[[], list[str]] | None:
    """What a stall warning names as not running: the local stack's stopped servers (nothing for a remote one)."""
    return None if server.remote else lambda: stopped(read_state(state_dir(args)))


def _interrupted(server: Server, *, started: bool) -> int:
    if not started:
        print(
            f"\ngymckpt collect: interrupted while starting the job on {server.url}; "
            f"{server.attach_command()} shows whether it started",
            file=sys.stderr,
        )
    else:
        print(
            f"\ngymckpt collect: stopped following; the job keeps running on {server.url}: "
            f"{server.attach_command()} follows it again",
            file=sys.stderr,
        )
    return EXIT_INTERRUPTED


def _report(args: argparse.Namespace, status: dict[str, Any], results: Path) -> int:
    mean = status["mean_reward"]
    print(
        f"collected {status['finished']} {plural(status['finished'], 'rollout')} ({status['errors']} "
        f"{plural(status['errors'], 'error')}); mean reward {'-' if mean is None else f'{mean:.3f}'}; "
        f"results in {results}"
    )
    print(reward_table(results))
    if status["finished"] and status["errors"] == status["finished"]:
        print(
            f"gymckpt collect: every episode failed; the first error is in {results}, the servers' logs "
            f"({state_dir(args) / 'logs'} for a local stack) say why",
            file=sys.stderr,
        )
        return 1
    return 0
