"""``gymckpt demo``: the main job — a stack that checkpoints itself, crashed and preempted, resumed, compared."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_services.demo.workers import LLAMA_MAX_OUTPUT_TOKENS, WORKER_KINDS

if TYPE_CHECKING:  # the story is imported when the demo runs, not for `gymckpt --help`
    from gym_services.demo.story import Run, Story


def cmd_demo(args: argparse.Namespace) -> int:
    from gym_services.commands.progress import JobProgress
    from gym_services.demo.preemption import DEMO_EVERY_S
    from gym_services.demo.report import compare_stories
    from gym_services.demo.story import StoryError
    from gym_services.stack.launcher import StackError

    progress = JobProgress(sys.stderr)
    story = _story(args, None if args.quiet else progress)
    started = time.perf_counter()
    try:
        story.prepare()
        print(
            f"gymckpt demo: {len(story.tasks)} example tasks x {args.repeats} over 4 environments "
            "(Workplace Assistant, indirect prompt injection, blackjack, Lean proofs with the sandbox stand-in)"
        )
        print(f"1) uninterrupted run: start every server as its own process{_scale(args)}, collect all rollouts")
        base = story.uninterrupted()
        progress.close()
        crash, preemption = _side_by_side(story, args)
    except (StoryError, StackError, ValueError) as exc:
        print(f"\ngymckpt demo failed: {exc}", file=sys.stderr)
        return 2
    finally:
        progress.close()
        story.close()
    verdict = compare_stories(base, crash, preemption, story.agent_env, DEMO_EVERY_S)
    print()
    print(verdict.text)
    print()
    if verdict.ok:
        print(
            "OK: every episode's reward and training tokens equal the uninterrupted run's after the crash and after "
            "the preemption; the preemption redid no generation, the crash only the work since the newest checkpoint "
            f"({time.perf_counter() - started:.0f} s; files in {story.workdir})"
        )
        return 0
    print("MISMATCH:\n  " + "\n  ".join(verdict.problems), file=sys.stderr)
    return 1


def _story(args: argparse.Namespace, progress: Callable[[str, dict[str, Any]], None] | None) -> Story:
    from gym_services.base.config import StorageConfig
    from gym_services.demo.story import Story

    return Story(
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
        progress=progress,
    )


def _scale(args: argparse.Namespace) -> str:
    scale = " (inference: llama.cpp's llama-server, the tiny generated model)" if args.engine == "llama.cpp" else ""
    if args.replicas > 1 or args.workers > 1:
        scale += (
            f" with {args.replicas} replicas of every server but the collection and {args.workers} inference workers"
        )
    return scale


def _side_by_side(story: Story, args: argparse.Namespace) -> tuple[Run, Run]:
    """The crash and the preemption, each on a stack of its own, at the same time (two progress bars)."""
    from gym_services.commands.progress import JobProgress
    from gym_services.demo.preemption import DEMO_EVERY_S, DEMO_GRACE_S, crashed, preempted

    kill = ""
    if story.kill_worker_at is not None:
        kill = f"SIGKILL one inference worker mid-generation once {story.kill_worker_at:.0%} of the rollouts finished, "
    at = f"{args.checkpoint_at:.0%}"
    print(
        f"2) and 3), side by side, each stack checkpointing itself every {DEMO_EVERY_S:g} s into {story.storage}:\n"
        f"2) crash: {kill}once {at} of the rollouts finished, SIGKILL every process with no warning; started again, "
        "the stack resumes by itself from its newest checkpoint\n"
        f"3) preemption: once {at} of the rollouts finished, SIGTERM to every server (as a preempted node's pods get "
        f"it; no checkpoint command): the stack takes a final checkpoint within its {DEMO_GRACE_S:g} s grace and "
        "exits; started again, it resumes by itself",
        flush=True,
    )
    bars = {"crash": JobProgress(sys.stderr, position=0), "preempted": JobProgress(sys.stderr, position=1)}
    if story.progress is not None:
        story.progress = lambda label, job: bars["crash" if label.startswith("crash") else "preempted"](label, job)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="story") as pool:
            crash, preemption = pool.submit(crashed, story), pool.submit(preempted, story)
            return crash.result(), preemption.result()
    finally:
        for bar in bars.values():
            bar.close()


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
        help="the whole story: a stack that checkpoints itself, crashed (SIGKILL) and preempted (SIGTERM), resumes "
        "by itself; compared with an uninterrupted run",
        description="Start every shipped server as a local process and collect the example tasks of every environment, "
        "three times: uninterrupted; with the stack checkpointing itself on a schedule and every process killed with "
        "SIGKILL while generations, tool calls and environment steps are in flight; and with SIGTERM to every server "
        "(a preemption), on which the stack takes a final checkpoint and exits. Each time the stack is started again "
        "and resumes by itself, with no checkpoint or restore command. Compares rewards, training tokens and "
        "generation work with the uninterrupted run. Exits non-zero if any reward or training token differs.",
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
    p.add_argument("--repeats", type=int, default=1, help="rollouts per task (default 1)")
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
