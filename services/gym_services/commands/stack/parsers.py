"""The parsers of ``gymckpt up/restart/down/status/collect/checkpoint/restore/checkpoints`` (a local stack).

Kept apart from their handlers (the other modules of :mod:`gym_services.commands.stack`), which are imported only
when one of these commands runs: the handlers load the control plane's models, the coordinator and their HTTP
clients, which ``gymckpt --help``, ``gymckpt serve`` and the other commands do not need (a cold ``gymckpt
checkpoint`` spent most of its time importing them). ``benchmarks/cli_checkpoint.py`` measures it,
``tests/services/cli/test_cli_imports.py`` keeps it so. One register function per group of commands, as the
handlers are grouped.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable

from gym_services.control.protocol import (
    DEFAULT_LEASE_S,
    DEFAULT_PREPARE_TIMEOUT_S,
    DEPRECATED_BACKGROUND,
    CheckpointMethod,
)

DEFAULT_STATE_DIR = os.environ.get("GYMCKPT_STATE_DIR", ".gymckpt/stack")


class Handler:
    """The handler ``name`` of ``gym_services.commands.stack.<module>``, that module imported when it runs."""

    def __init__(self, module: str, name: str) -> None:
        self.module = f"gym_services.commands.stack.{module}"
        self.__name__ = self.__qualname__ = name

    def load(self) -> Callable[[argparse.Namespace], int]:
        command: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(self.module), self.__name__)
        return command

    def __call__(self, args: argparse.Namespace) -> int:
        return self.load()(args)


def _common(p: argparse.ArgumentParser, storage: bool = False) -> None:
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"stack state folder (default {DEFAULT_STATE_DIR})")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for servers (default 60)")
    if storage:
        p.add_argument("--storage", help="location: file:///path or s3://bucket/prefix (default: the stack's)")
        p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every local-stack command, group by group (the order of ``gymckpt --help``)."""
    register_lifecycle(sub)
    register_collect(sub)
    register_checkpoint(sub)
    register_restore(sub)
    register_catalog(sub)


def register_lifecycle(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``up``, ``restart``, ``down``, ``status`` (:mod:`.lifecycle`)."""
    p = sub.add_parser(
        "up",
        help="start every server of a stack config as local processes (resuming from its checkpoint)",
        description="Start every server of a stack YAML and the stack's supervisor, wait until each is ready, write "
        "the state file. The supervisor takes a checkpoint every --checkpoint-every, keeps --keep of them, and on "
        "SIGTERM to any server (gymckpt down, a scheduler, kill) takes a final checkpoint within --termination-grace "
        "before everything exits. A state folder whose stack checkpointed itself is resumed from its newest "
        "checkpoint (the final one after a termination; after a crash, the newest scheduled one); --fresh starts "
        "empty. With some servers of the stack still running, only the missing ones are started.",
    )
    p.add_argument("config", help="stack YAML")
    p.add_argument("--state-dir", default=None, help="override the config's state_dir")
    p.add_argument(
        "--storage",
        help="override the config's storage: embedded-s3 (start a local S3 store), s3://bucket/prefix or file:///path",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness (default 60)")
    p.add_argument(
        "--checkpoint-every",
        metavar="DURATION",
        help="take a checkpoint this often, e.g. 30s, 5m (default: the config's checkpoint.every; none: only on "
        "termination and when asked)",
    )
    p.add_argument("--keep", type=int, help="scheduled and final checkpoints kept, older ones deleted (default 5)")
    p.add_argument(
        "--termination-grace",
        metavar="DURATION",
        help="on SIGTERM the servers hold their state this long for the final checkpoint (default 30s; under Slurm's "
        "--signal=TERM@N, less than N)",
    )
    p.add_argument("--fresh", action="store_true", help="start empty instead of resuming from the stack's checkpoint")
    p.set_defaults(func=Handler("lifecycle", "cmd_up"))

    p = sub.add_parser(
        "restart",
        help="start one server of the running stack again (after a crash)",
        description="Start one server of the running stack again, from its saved config on its own "
        "port, while the others keep running (SIGTERM first if it still runs). `gymckpt up CONFIG` "
        "starts every server that is missing.",
    )
    _common(p)
    p.add_argument("name", help="the server's name (as `gymckpt status` lists it)")
    p.set_defaults(func=Handler("lifecycle", "cmd_restart"))

    p = sub.add_parser(
        "down",
        help="stop the stack, with a final checkpoint",
        description="Stop the running stack as a preemption would: SIGTERM to every server; the stack's supervisor "
        "takes a final checkpoint within the termination grace, then everything exits. `gymckpt up` resumes from it. "
        "--no-checkpoint stops without one; --kill simulates a crash.",
    )
    _common(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--no-checkpoint", action="store_true", help="stop at once, without a final checkpoint")
    how.add_argument("--kill", action="store_true", help="SIGKILL everything (simulates a crash; no checkpoint)")
    p.set_defaults(func=Handler("lifecycle", "cmd_down"))

    p = sub.add_parser(
        "status",
        help="state, live counts and the last checkpoint of every participant",
        description="Show every participant of the running stack: serving, terminating, or the phase of the "
        "checkpoint or restore it is in, and its live counts; then the checkpoint open now or the "
        "last upload's outcome, and the schedule: the last, next and last successful checkpoint. Fits 120 columns; "
        "--wide for every detail. Exits 1 when a server is not running.",
    )
    _common(p)
    p.add_argument(
        "--wide",
        action="store_true",
        help="every detail: all live counts, the checkpoint and blockers, "
        "the last upload and event of each participant (wider than a terminal)",
    )
    p.add_argument("--json", action="store_true", help="the participants' raw status answers as JSON")
    p.set_defaults(func=Handler("lifecycle", "cmd_status"))


def register_collect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``collect`` (:mod:`.collect`)."""
    p = sub.add_parser(
        "collect",
        help="run rollout collection on the stack's (or a cluster's) collection server",
        description="Start a collection job (tasks JSONL x repeats) and follow it (progress on stderr). "
        "With --url, talk to a remote collection server (on Kubernetes: `kubectl port-forward "
        "svc/RELEASE-gym-checkpoint-collection 8000`, then --url http://127.0.0.1:8000): the tasks are "
        "uploaded and the results downloaded to --output. --attach follows the job already running.",
    )
    _common(p)
    p.add_argument("tasks", nargs="?", help="tasks JSONL (omit with --attach)")
    p.add_argument("--url", help="base URL of a collection server (default: the local stack's)")
    p.add_argument("--attach", action="store_true", help="follow the job already running instead of starting one")
    p.add_argument(
        "--output",
        default="results.jsonl",
        help="results JSONL (default results.jsonl); a file that already holds results is refused unless --overwrite "
        "or --resume",
    )
    kept = p.add_mutually_exclusive_group()
    kept.add_argument("--overwrite", action="store_true", help="replace the results an earlier job left in --output")
    kept.add_argument(
        "--resume",
        action="store_true",
        help="keep the results --output holds from an earlier run of the same tasks and --repeats and run only the "
        "(task, repeat) pairs it lacks (no checkpoint needed; a local stack's results file only)",
    )
    p.add_argument("--repeats", type=int, default=1, help="rollouts per task (default 1)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once (default 8)")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--collection", default="collection", help="name of the collection server in the local stack")
    p.add_argument("--no-wait", action="store_true", help="start the job and return")
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=7 * 86400.0,
        help="stop following after this many seconds (the job keeps running; default 7 days)",
    )
    p.add_argument(
        "--stall-warning",
        type=float,
        default=60.0,
        help="say so on stderr when no episode finished (or the server did not answer) for this many "
        "seconds, and again every as many seconds (default 60)",
    )
    p.set_defaults(func=Handler("collect", "cmd_collect"))


def register_checkpoint(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``checkpoint`` (:mod:`.checkpoint`)."""
    p = sub.add_parser(
        "checkpoint",
        help="take a consistent checkpoint of the running stack",
        description="prepare -> capture -> resume -> persist -> publish over every participant: the rollouts wait "
        "only while each server captures its state; records are packed, uploaded and verified in the background, "
        "and the checkpoint exists once its manifest is published. --method sync persists and publishes while the "
        "rollouts wait (prepare -> capture -> persist -> publish -> resume).",
    )
    _common(p, storage=True)
    p.add_argument("--id", help="checkpoint id (default: timestamped); an id already taken is refused")
    p.add_argument(
        "--transaction-id",
        help="name of the checkpoint transaction (default: a new one); repeat an "
        "interrupted checkpoint by passing the --id and transaction id it printed",
    )
    p.add_argument(
        "--method",
        choices=[*(m.value for m in CheckpointMethod), DEPRECATED_BACKGROUND],
        default=CheckpointMethod.BACKGROUND.value,
        help="background: write after resume, while the rollouts run (default); sync: write under the pause "
        f"({DEPRECATED_BACKGROUND}: the old name of background, deprecated)",
    )
    p.add_argument(
        "--prepare-timeout",
        type=float,
        default=DEFAULT_PREPARE_TIMEOUT_S,
        help=f"seconds to reach boundaries (default {DEFAULT_PREPARE_TIMEOUT_S:g})",
    )
    p.add_argument("--lease", type=float, default=DEFAULT_LEASE_S, help=f"lease seconds (default {DEFAULT_LEASE_S:g})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=Handler("checkpoint", "cmd_checkpoint"))


def register_restore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``restore`` (:mod:`.restore`)."""
    p = sub.add_parser(
        "restore",
        help="restore a checkpoint into the running (fresh) stack",
        description="Verify the checkpoint, restore every participant all-or-nothing, resume.",
    )
    _common(p, storage=True)
    p.add_argument("checkpoint_id", help="the checkpoint to restore (its id at the storage location)")
    p.add_argument("--lease", type=float, default=DEFAULT_LEASE_S, help=f"lease seconds (default {DEFAULT_LEASE_S:g})")
    p.add_argument(
        "--restore-id",
        help="name of the restore transaction (default: a new one); repeat an interrupted "
        "restore by passing its id again",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=Handler("restore", "cmd_restore"))


def register_catalog(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``checkpoints list/show/delete/prune`` (:mod:`.catalog`)."""
    p = sub.add_parser(
        "checkpoints",
        help="list, show or delete checkpoints at a storage location",
        description="Read checkpoints from a storage location.",
    )
    inner = p.add_subparsers(dest="checkpoints_command", required=True, metavar="ACTION")
    q = inner.add_parser("list", help="every checkpoint, complete or not", description="List checkpoints.")
    _common(q, storage=True)
    q.set_defaults(func=Handler("catalog", "cmd_checkpoints_list"))
    q = inner.add_parser("show", help="one checkpoint's manifest", description="Show one checkpoint's manifest.")
    _common(q, storage=True)
    q.add_argument("checkpoint_id", help="the checkpoint to show")
    q.add_argument("--json", action="store_true", help="print the manifest as JSON")
    q.set_defaults(func=Handler("catalog", "cmd_checkpoints_show"))
    q = inner.add_parser(
        "delete",
        help="remove one checkpoint's stored objects",
        description="Delete every object of one checkpoint at a storage location (its manifest "
        "first, so it is never restorable half deleted). Refused while a participant of the "
        "running local stack is restoring it. On Kubernetes, delete the Checkpoint resource "
        "instead (its spec.deletionPolicy decides whether the data goes with it).",
    )
    _common(q, storage=True)
    q.add_argument("checkpoint_id", help="the checkpoint to delete")
    q.set_defaults(func=Handler("catalog", "cmd_checkpoints_delete"))
    q = inner.add_parser(
        "prune",
        help="remove what checkpoints that never published left behind",
        description="Remove the objects of checkpoints that will never be published: unpublished "
        "ones whose claim is older than the bound to publish (6 h, plus 10 min for clocks), or "
        "that have no claim, and what deleted checkpoints kept for others that no checkpoint "
        "reads any more. Published checkpoints and those still being written are never touched.",
    )
    _common(q, storage=True)
    q.set_defaults(func=Handler("catalog", "cmd_checkpoints_prune"))
