"""The collection server's job API as ``gymckpt collect`` calls it: start a job (uploading its tasks to a remote
server), attach to the running one, download its results, and the token the job routes take."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from gym_services.base.text import human_bytes
from gym_services.commands.stack.running import plural
from gym_services.stack.launcher import StackState, stack_secrets

if TYPE_CHECKING:  # imported by `collect` only: with it httpx loads rich, click and pygments (~0.3 s at start)
    import httpx


class CollectError(RuntimeError):
    """The collection server refused or the job could not be followed."""


def local_job_token(args: argparse.Namespace, state: StackState) -> str:
    """GYMCKPT_JOB_TOKEN, else the job token in the local collection server's config, else the stack's control token."""
    if os.environ.get("GYMCKPT_JOB_TOKEN"):
        return os.environ["GYMCKPT_JOB_TOKEN"]
    config = Path(state.state_dir) / "configs" / f"{args.collection}.yaml"
    try:
        configured = (yaml.safe_load(config.read_text()) or {}).get("job_token")
    except (OSError, yaml.YAMLError, AttributeError):
        configured = None
    return str(configured) if configured else stack_secrets(Path(args.state_dir).resolve())["control_token"]


def answer(resp: httpx.Response) -> dict[str, Any]:
    """The JSON body of a 200 answer, else :class:`CollectError` with the server's message."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise CollectError(
            f"{resp.request.method} {resp.request.url.path}: HTTP {resp.status_code}: {message or resp.text[:300]}"
        )
    return cast(dict[str, Any], body)


def attach(http: httpx.Client, url: str) -> dict[str, Any]:
    status = answer(http.get(f"{url}/jobs/current"))
    if status["state"] == "idle":
        raise CollectError(f"no collection job on {url}; start one with `gymckpt collect TASKS`")
    return status


def start_job(http: httpx.Client, url: str, args: argparse.Namespace, remote: bool) -> dict[str, Any]:
    tasks = Path(args.tasks)
    if remote:
        spec: dict[str, Any] = _upload_tasks(http, url, tasks)
    else:
        spec = {"tasks_path": str(tasks.resolve()), "output_path": str(Path(args.output).resolve())}
    spec.update(repeats=args.repeats, concurrency=args.concurrency)
    if getattr(args, "resume", False):
        spec["resume"] = True
    if args.limit:
        spec["limit"] = args.limit
    return answer(http.post(f"{url}/jobs", json=spec))


def _upload_tasks(http: httpx.Client, url: str, tasks: Path) -> dict[str, Any]:
    """Upload the tasks file under a new name (a restore re-reads its file); the job spec's paths on the server."""
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in tasks.stem)[:80].strip(".-_") or "tasks"
    name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    with tasks.open("rb") as fh:
        uploaded = answer(http.put(f"{url}/tasks/{name}", content=fh, headers={"content-type": "application/x-ndjson"}))
    print(
        f"uploaded {uploaded['tasks']} {plural(uploaded['tasks'], 'task')} ({human_bytes(uploaded['bytes'])}) "
        f"to {url} as {uploaded['tasks_path']}",
        file=sys.stderr,
    )
    return {"tasks_path": uploaded["tasks_path"], "output_path": f"results/{name}"}


def download_results(http: httpx.Client, url: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    with http.stream("GET", f"{url}/jobs/current/results") as resp:
        if resp.status_code != 200:
            resp.read()
            answer(resp)
        with tmp.open("wb") as fh:
            for chunk in resp.iter_bytes():
                fh.write(chunk)
    tmp.replace(path)
