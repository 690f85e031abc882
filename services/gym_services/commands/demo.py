"""``gymckpt demo``: the main job — checkpoint mid-flight, SIGKILL, restore, compare."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gym_services.demo.workers import LLAMA_MAX_OUTPUT_TOKENS, WORKER_KINDS


def cmd_demo(args: argparse.Namespace) -> int:
    from gym_services.base.config import StorageConfig
    from gym_services.commands.progress import JobProgress
    from gym_services.demo.report import compare
    from gym_services.demo.story import Story, StoryError
    from gym_services.stack.launcher import StackError

    progress = JobProgress(sys.stderr)
    story = Story(
        Path(args.workdir),
        storage=args.storage,
        storage_config=StorageConfig(endpoint_url=args.s3_endpoint) if args.s3_endpoint else None,
        repeats=args.repeats,
        concurrency=args.concurrency,
        tokens_per_second=args.tokens_per_second,
        checkpoint_at=args.checkpoint_at,
        replicas=args.replicas,
        workers=args.workers,
        kill_worker_at=None if args.workers < 2 or args.no_worker_kill else args.checkpoint_at / 2,
        engine=args.engine,
        tasks_per_environment=args.tasks,
        say=lambda text: print(text, flush=True),
        progress=None if args.quiet else progress,
    )
    started = time.perf_counter()
    scale = " (inference: llama.cpp's llama-server, the tiny generated model)" if args.engine == "llama.cpp" else ""
    if args.replicas > 1 or args.workers > 1:
        scale += (
            f" with {args.replicas} replicas of every server but the collection and {args.workers} inference workers"
        )
    try:
        story.prepare()
        print(
            f"gymckpt demo: {len(story.tasks)} example tasks x {args.repeats} over 4 environments "
            "(Workplace Assistant, indirect prompt injection, blackjack, Lean proofs with the sandbox stand-in)"
        )
        print(f"1) uninterrupted run: start every server as its own process{scale}, collect all rollouts", flush=True)
        base = story.uninterrupted()
        progress.close()
        kill = ""
        if story.kill_worker_at is not None:
            done = f"{story.kill_worker_at:.0%}"
            kill = f"SIGKILL one inference worker mid-generation once {done} of the rollouts finished, "
        print(
            f"2) checkpointed run: collect, {kill}checkpoint once {args.checkpoint_at:.0%} of the rollouts finished to "
            f"{story.storage}, SIGKILL everything, restore into fresh processes, finish",
            flush=True,
        )
        ckpt = story.checkpointed()
    except (StoryError, StackError, ValueError) as exc:
        print(f"\ngymckpt demo failed: {exc}", file=sys.stderr)
        return 2
    finally:
        progress.close()
        story.close()
    verdict = compare(base, ckpt, story.agent_env)
    print()
    print(verdict.text)
    print()
    if verdict.ok:
        print(
            f"OK: every episode's reward equals the uninterrupted run; no generation was redone "
            f"({time.perf_counter() - started:.0f} s; files in {story.workdir})"
        )
        return 0
    print("MISMATCH:\n  " + "\n  ".join(verdict.problems), file=sys.stderr)
    return 1


def _count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError("must be between 1 and 8")
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole story: collect, checkpoint mid-flight, SIGKILL, restore, compare with an uninterrupted run",
        description="Start every shipped server as a local process, collect the example tasks of every environment, "
        "take a checkpoint while generations, tool calls and environment steps are in flight, kill every process with "
        "SIGKILL, restore into fresh processes, finish, and compare rewards and generation work with an uninterrupted "
        "run. Exits non-zero if any reward differs.",
    )
    p.add_argument(
        "--workdir", default=".gymckpt/demo", help="where runs, logs and checkpoints go (default .gymckpt/demo)"
    )
    p.add_argument(
        "--storage",
        help="checkpoint location: file:///path (default file://WORKDIR), s3://bucket/prefix "
        "(AWS_* variables or --s3-endpoint), or embedded-s3 (a local SeaweedFS the demo starts and stops)",
    )
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default AWS_ENDPOINT_URL)")
    p.add_argument("--repeats", type=int, default=2, help="rollouts per task (default 2)")
    p.add_argument(
        "--tasks",
        type=_at_least_one,
        metavar="N",
        help="only the first N example tasks of each environment (default all of them)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="episodes in flight at once (default 32)")
    p.add_argument(
        "--engine",
        choices=WORKER_KINDS,
        default="builtin",
        help="the inference worker: builtin (scripted policies that solve the tasks, paced by --tokens-per-second) or "
        "llama.cpp (llama.cpp's llama-server from the engine extra serving the tiny generated model, random weights: "
        f"each model call stops after {LLAMA_MAX_OUTPUT_TOKENS} tokens; seeded sampling; default builtin)",
    )
    p.add_argument(
        "--tokens-per-second", type=float, default=150.0, help="built-in worker speed per generation (default 150)"
    )
    p.add_argument(
        "--checkpoint-at",
        type=float,
        default=0.4,
        help="checkpoint once this fraction of the rollouts finished (default 0.4)",
    )
    p.add_argument(
        "--replicas",
        type=_count,
        default=1,
        help="processes of every participant but the collection, each its own participant; every call of a "
        "rollout reaches the replica holding it (default 1)",
    )
    p.add_argument(
        "--workers",
        type=_count,
        default=1,
        help="inference workers behind the policy model; with 2 or more, one is killed with SIGKILL "
        "mid-generation before the checkpoint and its generations continue on the others (default 1)",
    )
    p.add_argument("--no-worker-kill", action="store_true", help="with --workers 2 or more: kill no worker")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_demo)
