"""The CLI's light import path: what a command loads before it runs, checked in a fresh interpreter.

A cold ``gymckpt checkpoint`` spent most of its start-up importing what it never uses: httpx (which loads rich, click
and pygments), starlette, every handler's modules. The time is measured by ``benchmarks/cli_checkpoint.py``; this
checks the cause stays away: which packages each step imports (no durations).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: packages the checkpoint command never needs: the collect command's HTTP client and what it loads, a server's
#: web stack, the S3 client (a file:// checkpoint), Kubernetes, the Workplace tables, progress bars
NEVER_FOR_CHECKPOINT = [
    "httpx",
    "rich",
    "click",
    "pygments",
    "starlette",
    "uvicorn",
    "fastapi",
    "boto3",
    "botocore",
    "kubernetes",
    "pandas",
    "numpy",
    "tqdm",
]
#: what the parser alone (``gymckpt --help``, ``gymckpt serve``'s argument parsing) must not load either
NEVER_FOR_THE_PARSER = [*NEVER_FOR_CHECKPOINT, "aiohttp", "pydantic", "yaml"]

PROBE = """
import json, sys
from gym_services import cli
parser = cli.build_parser()
after_parser = sorted(m.split(".")[0] for m in sys.modules)
args = parser.parse_args(["checkpoint", "--state-dir", "/nonexistent"])
import gym_services.commands.stack.checkpoint  # what args.func imports when it runs
print(json.dumps({"parser": after_parser, "checkpoint": sorted(m.split(".")[0] for m in sys.modules),
                  "handler": args.func.__name__}))
"""


def probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_the_parser_loads_no_handler_and_no_heavy_package() -> None:
    seen = probe()
    assert sorted(set(NEVER_FOR_THE_PARSER) & set(seen["parser"])) == []
    assert seen["handler"] == "cmd_checkpoint"


def test_the_checkpoint_handler_loads_only_what_a_checkpoint_needs() -> None:
    seen = probe()
    assert sorted(set(NEVER_FOR_CHECKPOINT) & set(seen["checkpoint"])) == []
    assert {"aiohttp", "pydantic"} <= set(seen["checkpoint"])  # the control client and the protocol's models


def test_the_handler_modules_are_imported_only_when_a_stack_command_runs() -> None:
    code = (
        "import sys; from gym_services import cli; cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('gym_services.commands.stack')), "
        "'gym_services.coordination.coordinator' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["['gym_services.commands.stack',", "'gym_services.commands.stack.parsers']", "False"]


def test_every_stack_command_names_a_handler_that_exists() -> None:
    """The handlers are looked up by name when a command runs: each must be there (a typo would fail only then)."""
    from gym_services.cli import build_parser
    from gym_services.commands.stack.parsers import Handler

    def handlers(parser: argparse.ArgumentParser) -> list[Handler]:
        found = [parser._defaults["func"]] if isinstance(parser._defaults.get("func"), Handler) else []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [h for sub in action.choices.values() for h in handlers(sub)]
        return found

    every = handlers(build_parser())
    assert len(every) == 11  # up restart down status collect checkpoint restore checkpoints list/show/delete/prune
    for handler in every:
        assert callable(handler.load()) and handler.load().__name__ == handler.__name__, handler.module
