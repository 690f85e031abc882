"""``gymckpt up/down/status/collect/checkpoint/restore/checkpoints``: a local stack."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from gym_services.base.config import ConfigError, StorageConfig
from gym_services.base.downstream import DownstreamFailure
from gym_services.base.text import human_bytes, table
from gym_services.commands.output import EXIT_INTERRUPTED, transaction_summary
from gym_services.commands.status import status_table
from gym_services.control.models import StatusResponse
from gym_services.control.participant import InvalidState
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointInFlight, CheckpointStore, restoring
from gym_services.coordination.client import ControlClient, ParticipantError
from gym_services.coordination.coordinator import Coordinator, list_checkpoints
from gym_services.stack.config import load_stack
from gym_services.stack.discovery import discover
from gym_services.stack.launcher import (
    StackError,
    StackState,
    is_running,
    partly_running,
    read_state,
    restart_server,
    stack_secrets,
    start_missing,
    start_stack,
    stop_server,
    stop_stack,
)
from gym_services.stack.objectstore import BUCKET, REGION, store_running

if TYPE_CHECKING:  # imported by `collect` only: with it httpx loads rich, click and pygments (~0.3 s, issue 29)
    import httpx


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir).resolve()


def _storage_config(args: argparse.Namespace, state: StackState | None = None) -> StorageConfig:
    """How the CLI reaches storage: --s3-endpoint, else the stack's local S3 store (for its own bucket),
    else the standard AWS variables."""
    endpoint = getattr(args, "s3_endpoint", None)
    if state is None:
        try:
            state = read_state(_state_dir(args))
        except StackError:
            state = None
    location = getattr(args, "storage", None)
    store = state.object_store if state is not None else None
    if (
        store is not None
        and state is not None
        and not endpoint
        and (location is None or location.startswith(f"s3://{BUCKET}/"))
    ):
        creds = stack_secrets(Path(state.state_dir))
        return StorageConfig(
            endpoint_url=store.endpoint,
            region=REGION,
            access_key_id=creds["s3_access_key"],
            secret_access_key=creds["s3_secret_key"],
        )
    return StorageConfig(endpoint_url=endpoint or os.environ.get("AWS_ENDPOINT_URL"))


def _storage_hint(args: argparse.Namespace, exc: Exception) -> Exception:
    """A storage error with what the stack knows: its local S3 store stopped with it, or where its own
    checkpoints are."""
    if not isinstance(exc, StorageError):
        return exc
    try:
        state = read_state(_state_dir(args))
    except StackError:
        return exc
    location = getattr(args, "storage", None)
    if (
        state.object_store is not None
        and not store_running(state.object_store)
        and (location is None or location.startswith(f"s3://{BUCKET}/"))
    ):
        return StorageError(
            f"{exc}; the stack's local S3 store stopped with the stack (`gymckpt down`): "
            "`gymckpt up CONFIG --storage embedded-s3` starts it again, with its data"
        )
    if location and location != state.storage:
        return StorageError(
            f"{exc}; the stack {state.name} keeps its checkpoints at {state.storage}, used when --storage is not given"
        )
    return exc


def _fail(prefix: str, exc: Exception) -> int:
    print(f"gymckpt {prefix}: {exc}", file=sys.stderr)
    return 1


def _running(args: argparse.Namespace) -> StackState:
    """The stack's state, refused with the next step when none of its servers runs (after `down`)."""
    state = read_state(_state_dir(args))
    if not any(is_running(s) for s in state.servers):
        raise StackError(
            f"the stack {state.name} is not running (its {len(state.servers)} servers have stopped); "
            "start it with `gymckpt up CONFIG`"
        )
    return state


def _stopped(state: StackState) -> list[str]:
    return [s.name for s in state.participants() if not is_running(s)]


async def _with_coordinator(args: argparse.Namespace, work, *, running_only: bool = False):
    """Run ``work`` with a coordinator over the stack's participants; every one must run, unless
    ``running_only`` (status: the stopped ones are reported, not asked)."""
    state = _running(args)
    stopped = _stopped(state)
    if stopped and not running_only:
        raise StackError(
            f"not running: {', '.join(stopped)}; a checkpoint or restore needs every participant "
            "(`gymckpt up CONFIG` starts what is missing while the rest keeps running)"
        )
    asked = state.model_copy(update={"servers": [s for s in state.servers if s.name not in stopped]})
    token = stack_secrets(_state_dir(args))["control_token"]
    async with ControlClient(token, timeout_s=args.timeout) as client:
        participants = await discover(asked, client)

        def progress(phase: str, detail: dict) -> None:
            if not getattr(args, "quiet", False):
                print(
                    f"  {time.strftime('%H:%M:%S')} {phase.lower()}",
                    flush=True,
                    file=sys.stderr if getattr(args, "json", False) else sys.stdout,
                )

        coordinator = Coordinator(participants, client, storage_config=_storage_config(args, state), on_event=progress)
        return await work(coordinator, state)


# --- up / down / status ------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    try:
        stack, _ = load_stack(args.config)
        if args.state_dir:
            stack.state_dir = args.state_dir
        if args.storage:
            try:
                stack = stack.model_validate({**stack.model_dump(), "storage": args.storage})
            except ValidationError:
                raise ConfigError(
                    f"--storage must be embedded-s3, s3://bucket/prefix or file:///absolute/path, got {args.storage!r}"
                ) from None
        state_dir = stack.resolved_state_dir(Path.cwd())
        if partly_running(state_dir):  # a server crashed: start it again, the others keep their live state
            state, started = start_missing(state_dir, ready_timeout_s=args.timeout)
            print(
                f"started {', '.join(started)} again from {state_dir / 'configs'}; the other "
                f"{len(state.servers) - len(started)} servers of stack {state.name} kept running"
            )
            return 0
        state = start_stack(stack, Path.cwd(), ready_timeout_s=args.timeout, say=lambda text: print(text, flush=True))
    except (ConfigError, StackError) as exc:
        return _fail("up", exc)
    print(f"stack {state.name} is up ({len(state.servers)} servers); state in {state.state_dir}")
    print(
        table(
            ["server", "type", "url", "pid", "participant"],
            [[s.name, s.server, s.url, s.pid, s.participant] for s in state.servers],
        )
    )
    if state.object_store is not None:
        print(
            f"local S3 store (SeaweedFS) at {state.object_store.endpoint}, data in {state.object_store.data_dir}; "
            "`gymckpt down` stops it, the data stays"
        )
    print(f"checkpoints go to {state.storage}")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    """Stop one server of the running stack (if it still runs) and start it again from its saved config."""
    state_dir = _state_dir(args)
    try:
        state = _running(args)
        server = next((s for s in state.servers if s.name == args.name), None)
        if server is None:
            raise StackError(
                f"no server {args.name!r} in stack {state.name} (its servers: "
                f"{', '.join(s.name for s in state.servers)})"
            )
        if is_running(server):
            stop_server(server)
        restarted = restart_server(state_dir, args.name, ready_timeout_s=args.timeout)
    except StackError as exc:
        return _fail("restart", exc)
    print(f"restarted {restarted.name} (pid {restarted.pid}) at {restarted.url}; log {restarted.log}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    try:
        stopped = stop_stack(_state_dir(args), kill=args.kill)
    except StackError as exc:
        return _fail("down", exc)
    if not stopped:
        print(f"nothing to stop: no server of the stack in {_state_dir(args)} was running")
        return 0
    verb = "killed" if args.kill else "stopped"
    print(f"{verb} {len(stopped)} {_plural(len(stopped), 'server')}: {', '.join(stopped)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Every participant's state; exits 1 when a server of the stack is not running (or does not answer)."""

    async def work(coordinator: Coordinator, state):
        return await coordinator.status(), _stopped(state)

    try:
        statuses, stopped = asyncio.run(_with_coordinator(args, work, running_only=True))
    except (StackError, ParticipantError) as exc:
        return _fail("status", exc)
    if args.json:
        answer = {pid: _status_json(pid, s) for pid, s in statuses.items()}
        answer.update({name: {"participant_id": name, "error": "not running"} for name in stopped})
        print(json.dumps(answer, indent=1))
    else:
        print(status_table(statuses, stopped, wide=args.wide))
    unreachable = [pid for pid, s in statuses.items() if isinstance(s, ParticipantError)]
    if stopped or unreachable:
        what = "; ".join(
            part
            for part in (
                f"not running: {', '.join(stopped)}" if stopped else "",
                f"not answering: {', '.join(unreachable)}" if unreachable else "",
            )
            if part
        )
        print(
            f"gymckpt status: {what}; `gymckpt up CONFIG` starts what is missing while the rest keeps running "
            f"(their logs: {_state_dir(args) / 'logs'})",
            file=sys.stderr,
        )
        return 1
    return 0


def _status_json(pid: str, status: StatusResponse | ParticipantError) -> dict:
    if isinstance(status, ParticipantError):
        return {"participant_id": pid, "error": status.reason}
    return status.model_dump(mode="json")


# --- collect ---------------------------------------------------------------------------


def cmd_collect(args: argparse.Namespace) -> int:
    """Start a job (or --attach to the running one), follow it, and report rewards.

    With --url the collection server is remote (on Kubernetes, reached through ``kubectl port-forward``): the
    tasks file is uploaded to it, and the results are downloaded to --output when the job completes."""
    if args.attach == bool(args.tasks):
        return _fail(
            "collect", RuntimeError("give a tasks JSONL to start a job, or --attach to follow the running one")
        )
    if args.url:
        url, remote = args.url.rstrip("/"), True
        token = os.environ.get("GYMCKPT_JOB_TOKEN") or os.environ.get("GYMCKPT_CONTROL_TOKEN")
        if not token:
            return _fail(
                "collect",
                CollectError(
                    "a remote collection server needs its job token: set GYMCKPT_JOB_TOKEN (the chart's collection "
                    "server takes the control token: kubectl get secret RELEASE-gym-checkpoint-generated "
                    "-o jsonpath='{.data.token}' | base64 -d)"
                ),
            )
    else:
        try:
            state = _running(args)
            url, remote = state.url(args.collection), False
            if args.collection in _stopped(state):
                raise StackError(
                    f"the collection server {args.collection} is not running; `gymckpt up CONFIG` starts it again"
                )
            token = _local_job_token(args, state)
        except (StackError, KeyError) as exc:
            return _fail("collect", exc)
    try:
        if args.tasks:
            check_tasks_file(Path(args.tasks), args.limit)
        if args.url or not args.attach:  # the results file this command (or the job it starts) writes
            _refuse_overwrite(Path(args.output), args.overwrite)
    except CollectError as exc:
        return _fail("collect", exc)
    import httpx

    status = None
    try:
        with httpx.Client(timeout=args.timeout, trust_env=False, headers={"authorization": f"Bearer {token}"}) as http:
            status = _attach(http, url) if args.attach else _start_job(http, url, args, remote)
            if args.no_wait:
                print(
                    f"collecting {status['total']} rollouts on {url}; follow with `gymckpt collect --attach"
                    f"{' --url ' + url if remote else ''}`"
                )
                return 0
            status = _follow(
                http,
                url,
                status,
                args.wait_timeout,
                args.stall_warning,
                None if remote else lambda: _stopped(read_state(_state_dir(args))),
            )
            results = Path(args.output) if remote else Path(status["output_path"])
            if remote:
                _download_results(http, url, results)
    except (CollectError, httpx.HTTPError, OSError) as exc:
        return _fail("collect", exc)
    except KeyboardInterrupt:
        attach = f"`gymckpt collect --attach{' --url ' + url if remote else ''}`"
        if status is None:
            print(
                f"\ngymckpt collect: interrupted while starting the job on {url}; {attach} shows whether it started",
                file=sys.stderr,
            )
        else:
            print(
                f"\ngymckpt collect: stopped following; the job keeps running on {url}: {attach} follows it again",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    mean = status["mean_reward"]
    print(
        f"collected {status['finished']} {_plural(status['finished'], 'rollout')} ({status['errors']} "
        f"{_plural(status['errors'], 'error')}); mean reward {'-' if mean is None else f'{mean:.3f}'}; "
        f"results in {results}"
    )
    print(reward_table(results))
    if status["finished"] and status["errors"] == status["finished"]:
        print(
            f"gymckpt collect: every episode failed; the first error is in {results}, the servers' logs "
            f"({Path(_state_dir(args)) / 'logs'} for a local stack) say why",
            file=sys.stderr,
        )
        return 1
    return 0


def _plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"


def check_tasks_file(path: Path, limit: int | None = None) -> int:
    """The number of tasks in a tasks JSONL, or :class:`CollectError` naming the line, column and what to fix:
    a missing file, a folder, a line that is not a JSON object, a task without ``responses_create_params``,
    or no task at all. Checked here, before a job starts and anything is written."""
    if not path.exists():
        raise CollectError(f"no tasks file {path} (relative paths are relative to {Path.cwd()})")
    if not path.is_file():
        raise CollectError(f"{path} is not a file; give a tasks JSONL (one task object a line)")
    tasks = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CollectError(f"{path}, line {number}, column {exc.colno}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise CollectError(f"{path}, line {number}: a task must be a JSON object, not {type(row).__name__}")
                if not isinstance(row.get("responses_create_params"), dict):
                    raise CollectError(
                        f"{path}, line {number}: the task has no responses_create_params object "
                        '(the model request of its episode: {"input": [...]})'
                    )
                tasks += 1
                if limit is not None and tasks >= limit:
                    break
    except UnicodeDecodeError:
        raise CollectError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise CollectError(f"cannot read {path}: {exc.strerror or exc}") from None
    if tasks == 0:
        raise CollectError(f"{path} holds no task (one JSON object a line); nothing was started or written")
    return tasks


def _refuse_overwrite(output: Path, overwrite: bool) -> None:
    """Results of an earlier job are never replaced unless asked: a checkpoint of that job reads them."""
    try:
        size = output.stat().st_size if output.exists() else 0
    except OSError:
        size = 0
    if output.is_dir():
        raise CollectError(f"--output {output} is a folder; give a file name")
    if size and not overwrite:
        raise CollectError(
            f"{output} already holds {human_bytes(size)} of results (an earlier job's; a checkpoint of that job "
            f"needs them to restore); choose another file with --output, or replace it with --overwrite"
        )


class CollectError(RuntimeError):
    """The collection server refused or the job could not be followed."""


def _local_job_token(args: argparse.Namespace, state: StackState) -> str:
    """GYMCKPT_JOB_TOKEN, else the job token in the local collection server's config, else the stack's control token."""
    if os.environ.get("GYMCKPT_JOB_TOKEN"):
        return os.environ["GYMCKPT_JOB_TOKEN"]
    config = Path(state.state_dir) / "configs" / f"{args.collection}.yaml"
    try:
        configured = (yaml.safe_load(config.read_text()) or {}).get("job_token")
    except (OSError, yaml.YAMLError, AttributeError):
        configured = None
    return str(configured) if configured else stack_secrets(_state_dir(args))["control_token"]


def _answer(resp: httpx.Response) -> dict:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        raise CollectError(
            f"{resp.request.method} {resp.request.url.path}: HTTP {resp.status_code}: {message or resp.text[:300]}"
        )
    return body


def _attach(http: httpx.Client, url: str) -> dict:
    status = _answer(http.get(f"{url}/jobs/current"))
    if status["state"] == "idle":
        raise CollectError(f"no collection job on {url}; start one with `gymckpt collect TASKS`")
    return status


def _start_job(http: httpx.Client, url: str, args: argparse.Namespace, remote: bool) -> dict:
    tasks = Path(args.tasks)
    if remote:
        stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in tasks.stem)[:80].strip(".-_") or "tasks"
        name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"  # a new name each time: a restore re-reads its file
        with tasks.open("rb") as fh:
            uploaded = _answer(
                http.put(f"{url}/tasks/{name}", content=fh, headers={"content-type": "application/x-ndjson"})
            )
        print(
            f"uploaded {uploaded['tasks']} {_plural(uploaded['tasks'], 'task')} ({human_bytes(uploaded['bytes'])}) "
            f"to {url} as {uploaded['tasks_path']}",
            file=sys.stderr,
        )
        spec = {"tasks_path": uploaded["tasks_path"], "output_path": f"results/{name}"}
    else:
        spec = {"tasks_path": str(tasks.resolve()), "output_path": str(Path(args.output).resolve())}
    spec.update(repeats=args.repeats, concurrency=args.concurrency)
    if args.limit:
        spec["limit"] = args.limit
    return _answer(http.post(f"{url}/jobs", json=spec))


class Stall:
    """Says on stderr when a followed job makes no progress, or its server does not answer, for long."""

    def __init__(
        self, url: str, after_s: float, say: Callable[[str], None], missing: Callable[[], list[str]] | None = None
    ) -> None:
        self.url, self.after_s, self.say = url, after_s, say
        #: the local stack's servers that are not running (a crashed one is the likely cause of a stall)
        self.missing: Callable[[], list[str]] = missing or list
        self.finished: int | None = None
        self.progress_at = self.answered_at = time.monotonic()
        self.warned_at = 0.0
        self.last_error = ""

    def _due(self, since: float) -> bool:
        now = time.monotonic()
        if now - since < self.after_s or now - self.warned_at < self.after_s:
            return False
        self.warned_at = now
        return True

    def seen(self, status: dict) -> None:
        now = time.monotonic()
        self.answered_at = now
        if status["finished"] != self.finished:
            self.finished, self.progress_at = status["finished"], now
        if status["state"] in ("running", "paused") and self._due(self.progress_at):
            idle = status.get("idle_s") or now - self.progress_at
            why = f"{status['live']} live, {status['state']}"
            if status.get("retrying"):
                why += f"; {status['retrying']} waiting to run again after an infrastructure failure"
            if status.get("last_failure"):
                why += f"; cause: {status['last_failure']}"
            down = self.missing()
            if down:
                why += f"; not running: {', '.join(down)} (`gymckpt up CONFIG` starts it again)"
            self.say(
                f"gymckpt collect: no episode has finished for {idle:.0f}s ({why}); "
                "`gymckpt status` shows every server, their logs say more"
            )

    def unanswered(self, exc: Exception) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._due(self.answered_at):
            self.say(
                f"gymckpt collect: the collection server at {self.url} has not answered for "
                f"{time.monotonic() - self.answered_at:.0f}s ({self.last_error}); still trying until --wait-timeout"
            )


def waiting_lines(status: dict) -> list[str]:
    """``agent A waits for resources /seed_session: unreachable since ...``, one per server an agent's episodes
    are retrying (the job status's ``failing``)."""
    lines = []
    for agent, failures in sorted((status.get("failing") or {}).items()):
        for failure in failures:
            try:
                lines.append(f"agent {agent} waits for {DownstreamFailure.model_validate(failure).describe()}")
            except ValidationError:
                continue
    return lines


def _follow(
    http: httpx.Client, url: str, status: dict, wait_timeout: float, stall_warning_s: float = 60.0, missing=None
) -> dict:
    """Poll until the job completes (bounded by ``wait_timeout``); progress on stderr, a bar on a terminal;
    a job making no progress (or a server not answering) for ``stall_warning_s`` is reported there too."""
    import httpx
    from tqdm import tqdm

    deadline = time.monotonic() + wait_timeout
    terminal = sys.stderr.isatty()
    bar = tqdm(total=status["total"], unit="rollout", desc="collect", file=sys.stderr) if terminal else None

    def say(text: str) -> None:
        if bar is not None:
            bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    stall = Stall(url, stall_warning_s, say, missing)
    last_line = 0.0
    waiting_for: list[str] = []
    try:
        while True:
            stall.seen(status)
            now_waiting = waiting_lines(status)
            if [line.split(" since ")[0] for line in now_waiting] != [line.split(" since ")[0] for line in waiting_for]:
                if now_waiting:
                    for line in now_waiting:
                        say(f"collect: {line}")
                elif status["state"] != "completed":
                    say("collect: the servers the agents waited for answer again")
                waiting_for = now_waiting
            if bar is not None:
                bar.n = status["finished"]
                bar.set_postfix(live=status["live"], state=status["state"])
                bar.refresh()
            elif time.monotonic() - last_line >= 5 or status["state"] == "completed":
                last_line = time.monotonic()
                print(
                    f"collect: {status['finished']}/{status['total']} finished, "
                    f"{status['live']} live, {status['state']}",
                    file=sys.stderr,
                    flush=True,
                )
            if status["state"] == "completed":
                return status
            if time.monotonic() > deadline:
                raise CollectError(
                    f"the job did not complete within --wait-timeout {wait_timeout:.0f}s; it keeps running: "
                    "`gymckpt collect --attach` follows it again"
                )
            time.sleep(0.2)
            while True:
                try:
                    status = _answer(http.get(f"{url}/jobs/current"))
                    break
                except httpx.TransportError as exc:  # a server being replaced: keep trying until the deadline
                    stall.unanswered(exc)
                    if time.monotonic() > deadline:
                        raise CollectError(
                            f"the collection server at {url} stopped answering ({stall.last_error}) "
                            f"and --wait-timeout {wait_timeout:.0f}s ran out"
                        ) from None
                    time.sleep(0.5)
    finally:
        if bar is not None:
            bar.close()


def _download_results(http: httpx.Client, url: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    with http.stream("GET", f"{url}/jobs/current/results") as resp:
        if resp.status_code != 200:
            resp.read()
            _answer(resp)
        with tmp.open("wb") as fh:
            for chunk in resp.iter_bytes():
                fh.write(chunk)
    tmp.replace(path)


def reward_table(results: Path) -> str:
    """Per agent: episodes, errors, mean and min/max reward, from the results JSONL."""
    by_agent: dict[str, list[dict]] = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            by_agent.setdefault(row.get("agent", "?"), []).append(row)
    rows = []
    for agent, items in sorted(by_agent.items()):
        rewards = [float(r["reward"]) for r in items if isinstance(r.get("reward"), (int, float))]
        errors = sum(1 for r in items if "error" in r)
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        spread = f"{min(rewards):g} .. {max(rewards):g}" if rewards else "-"
        rows.append([agent, len(items), errors, mean, spread])
    return table(["agent", "episodes", "errors", "mean reward", "range"], rows)


# --- checkpoint / restore / checkpoints --------------------------------------------------


def cmd_checkpoint(args: argparse.Namespace) -> int:
    checkpoint_id = args.id or f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    transaction_id = args.transaction_id or uuid.uuid4().hex
    again = f"gymckpt checkpoint --id {checkpoint_id} --transaction-id {transaction_id}"
    try:
        state = _running(args)
        location = args.storage or state.storage
        _check_location(args, state, location)
    except (StackError, StorageError) as exc:
        return _fail("checkpoint", exc)

    async def work(coordinator: Coordinator, state, cancel: asyncio.Event):
        _header(
            args,
            f"checkpoint {checkpoint_id} of {len(coordinator.participants)} participants -> {location} "
            f"(transaction {transaction_id})",
        )
        return await coordinator.checkpoint(
            checkpoint_id,
            location,
            prepare_timeout_s=args.prepare_timeout,
            lease_s=args.lease,
            transaction_id=transaction_id,
            claimed_by=f"gymckpt checkpoint on {socket.gethostname()} (stack {state.name})",
            method=args.method,
            cancel=cancel,
        )

    code = _transaction(args, "checkpoint", work, again)
    if code == 0:
        _remember_configs(state, checkpoint_id)
    return code


CONFIGS_SEEN = "checkpoint-configs"  # <state dir>/checkpoint-configs/<id>.json: the server configs a checkpoint saw
_LOCAL_URL = re.compile(r"http://127\.0\.0\.1:\d+")


def server_configs(state: StackState) -> dict[str, dict[str, object]]:
    """Each participant's config as ``{dotted.key: value}``, without what changes on every `up` (ports, the
    local URLs of other servers, another server's port given as ``{port:NAME}``)."""
    configs: dict[str, dict[str, object]] = {}
    ports = {s.port for s in state.servers}
    for server in state.participants():
        path = Path(state.state_dir) / "configs" / f"{server.name}.yaml"
        try:
            loaded = yaml.safe_load(_LOCAL_URL.sub("http://127.0.0.1:PORT", path.read_text())) or {}
        except (OSError, yaml.YAMLError):
            continue
        flat = _flatten({k: v for k, v in loaded.items() if k not in ("host", "port", "log_level")})
        configs[server.name] = {
            # a port of this stack's servers (another server's, given as {port:NAME}) is new on every `up`
            key: "PORT" if key.endswith("port") and type(value) is int and value in ports else value
            for key, value in flat.items()
        }
    return configs


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """A nested mapping as ``{dotted.key: leaf}`` (an empty mapping is a leaf)."""
    if not (isinstance(value, dict) and value):
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _remember_configs(state: StackState, checkpoint_id: str) -> None:
    folder = Path(state.state_dir) / CONFIGS_SEEN
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{checkpoint_id}.json").write_text(json.dumps(server_configs(state), indent=1, default=str))


def config_changes(state: StackState, checkpoint_id: str) -> list[str]:
    """How the running stack's server configs differ from those checkpoint ``checkpoint_id`` of this stack saw
    (nothing when it was not taken here)."""
    try:
        then = json.loads((Path(state.state_dir) / CONFIGS_SEEN / f"{checkpoint_id}.json").read_text())
    except (OSError, ValueError):
        return []
    now = server_configs(state)
    changes = []
    for name in sorted(set(then) & set(now)):
        keys = sorted(set(then[name]) | set(now[name]))
        diff = [
            f"{k}: {then[name].get(k, '(unset)')} -> {now[name].get(k, '(unset)')}"
            for k in keys
            if then[name].get(k) != now[name].get(k)
        ]
        if diff:
            changes.append(f"{name} ({'; '.join(diff[:5])}{'; ...' if len(diff) > 5 else ''})")
    return changes


def _header(args: argparse.Namespace, line: str) -> None:
    """What a transaction is about to do: on stdout, on stderr under --json (stdout is the JSON alone), not
    at all under --quiet."""
    if not args.quiet:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _check_location(args: argparse.Namespace, state: StackState, location: str) -> None:
    """Refuse a storage location that cannot be used before anything is paused: an unsupported form,
    or a file:// folder that cannot be created."""
    open_storage(location, _storage_config(args, state))  # StorageError for an unsupported location
    if location.startswith("file://"):
        folder = Path(location.removeprefix("file://"))
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the storage folder {folder}: {exc.strerror or exc}; "
                "give a folder you can write with --storage file:///absolute/path"
            ) from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StorageError(f"the storage folder {folder} is not writable; give another with --storage")


def _transaction(args: argparse.Namespace, verb: str, work, again: str) -> int:
    """Run a checkpoint or restore against the stack and print its summary; 0 when completed.

    The first Ctrl-C ends the transaction as failed the way the coordinator does (every participant touched
    is aborted and resumes); a second one stops waiting: the transaction's task is cancelled, so its calls
    and its connections end in order (never a KeyboardInterrupt in the middle of the event loop). Either way
    one line says what state things are in and ``again``, the command that repeats the same transaction."""
    interrupts = 0
    abandoned = (
        f"each participant not aborted yet resumes on its own when its lease ends (--lease {args.lease:g}s; "
        f"`gymckpt status` shows them); `{again}` repeats the same {verb}"
    )

    async def run():
        cancel = asyncio.Event()
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()

        def on_sigint() -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:
                print(
                    f"\ngymckpt {verb}: Ctrl-C: ending the {verb} as failed, aborting the participants "
                    "(Ctrl-C again to stop waiting)",
                    file=sys.stderr,
                    flush=True,
                )
                cancel.set()
            elif main is not None:
                main.cancel()  # stop waiting: the calls in flight end here, the leases end the rest

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, not POSIX
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await _with_coordinator(args, lambda coordinator, state: work(coordinator, state, cancel))
        except asyncio.CancelledError:
            if interrupts < 2:
                raise
            return None
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)

    try:
        result = asyncio.run(run())
    except (StackError, ParticipantError, StorageError) as exc:
        return _fail(verb, exc)
    except OSError as exc:
        return _fail(verb, StackError(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"))
    except KeyboardInterrupt:  # before the handler above was installed
        print(f"\ngymckpt {verb}: interrupted before the participants answered; {abandoned}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result is None:  # a second Ctrl-C while the first one's abort was under way
        print(f"gymckpt {verb}: stopped waiting for the abort; {abandoned}", file=sys.stderr)
        return EXIT_INTERRUPTED
    interrupted = interrupts > 0
    print(result.model_dump_json(indent=1) if args.json else transaction_summary(result))
    if interrupted and not result.completed:
        anew = (
            "`gymckpt checkpoint` takes a new one"
            if verb == "checkpoint"
            else (f"`gymckpt restore {result.checkpoint_id}` restores it again")
        )
        print(
            f"gymckpt {verb}: interrupted; the {verb} failed and the participants resumed where they were; {anew}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0 if result.completed else 1


def cmd_restore(args: argparse.Namespace) -> int:
    restore_id = args.restore_id or uuid.uuid4().hex
    try:
        state = _running(args)
        location = args.storage or state.storage
        missing = _missing_checkpoint(args, state, location)
    except (StackError, StorageError) as exc:
        return _fail("restore", _storage_hint(args, exc))
    if missing:
        return _fail("restore", RuntimeError(missing))
    try:
        absent = _absent_servers(args, state, location)
    except (StorageError, ValueError) as exc:
        return _fail("restore", _storage_hint(args, exc))
    if absent:
        return _fail(
            "restore",
            StackError(
                f"checkpoint {args.checkpoint_id} holds the state of {', '.join(absent)}, which stack {state.name} "
                "has no server for; a restore needs every one: add them back to the stack YAML, "
                "then `gymckpt down` and `gymckpt up CONFIG`"
            ),
        )
    changed = config_changes(state, args.checkpoint_id)
    if changed:
        print(
            f"gymckpt restore: warning: server configs changed since {args.checkpoint_id} was taken: "
            f"{', '.join(changed)}; its episodes continue under the new configs",
            file=sys.stderr,
        )

    async def work(coordinator: Coordinator, state, cancel: asyncio.Event):
        _header(
            args,
            f"restore {args.checkpoint_id} from {location} into {len(coordinator.participants)} participants "
            f"(restore id {restore_id})",
        )
        return await coordinator.restore(
            args.checkpoint_id, location, lease_s=args.lease, restore_id=restore_id, cancel=cancel
        )

    return _transaction(args, "restore", work, f"gymckpt restore {args.checkpoint_id} --restore-id {restore_id}")


def _missing_checkpoint(args: argparse.Namespace, state: StackState, location: str) -> str | None:
    """None when the checkpoint's manifest is at ``location``; else a message naming where it looked
    and what to do next."""
    store = CheckpointStore(open_storage(location, _storage_config(args, state)))
    key = store.manifest_key(args.checkpoint_id)
    if store.is_published(args.checkpoint_id):
        return None
    known = [cid for cid, manifest in list_checkpoints(location, _storage_config(args, state)) if manifest is not None]
    there = f"checkpoints there: {', '.join(known)}" if known else "no complete checkpoint is there"
    hint = (
        "pass the location it was written to with --storage (e.g. --storage s3://bucket/prefix, with AWS_ENDPOINT_URL "
        "and keys set for a non-AWS store)"
        if not args.storage
        else "check the id (`gymckpt checkpoints list --storage LOCATION`)"
    )
    return f"no checkpoint {args.checkpoint_id} at {location} (looked for {store.url}/{key}); {there}; {hint}"


def _absent_servers(args: argparse.Namespace, state: StackState, location: str) -> list[str]:
    """Participants of the checkpoint whose server (or replica group) the stack does not have at all."""
    manifest = CheckpointStore(open_storage(location, _storage_config(args, state))).published(args.checkpoint_id)
    if manifest is None:
        return []
    here = {s.name for s in state.participants()} | {s.group_name for s in state.participants()}
    return sorted(
        p.participant_id
        for p in manifest.participants
        if p.participant_id not in here and re.sub(r"-\d+$", "", p.participant_id) not in here
    )


def _location(args: argparse.Namespace) -> str:
    if args.storage:
        return args.storage
    return read_state(_state_dir(args)).storage


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    try:
        location = _location(args)
        found = list_checkpoints(location, _storage_config(args))
    except (StackError, StorageError) as exc:
        return _fail("checkpoints list", _storage_hint(args, exc))
    rows: list[list[object]] = []
    for cid, manifest in found:
        if manifest is None:
            rows.append([cid, "incomplete", "", "", "", "", "", ""])
        else:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest.created_at))
            records = sum(p.records for p in manifest.participants)
            pause = manifest.timings.get("pause")
            rows.append(
                [
                    cid,
                    "complete",
                    created,
                    manifest.method,
                    len(manifest.participants),
                    records,
                    human_bytes(manifest.bytes),
                    "" if pause is None else f"{pause * 1000:.0f} ms",
                ]
            )
    print(f"checkpoints at {location}:")
    print(
        table(["id", "state", "created", "method", "participants", "records", "bytes", "pause"], rows)
        if rows
        else "(none)"
    )
    return 0


def cmd_checkpoints_show(args: argparse.Namespace) -> int:
    try:
        location = _location(args)
        store = CheckpointStore(open_storage(location, _storage_config(args)))
        manifest = store.published(args.checkpoint_id)
        if manifest is None:
            raise StackError(
                f"no complete checkpoint {args.checkpoint_id} at {location}; see `gymckpt checkpoints list`"
            )
    except (StackError, StorageError, ValueError) as exc:
        return _fail("checkpoints show", _storage_hint(args, exc))
    if args.json:
        print(manifest.model_dump_json(indent=1))
        return 0
    print(
        f"checkpoint {manifest.checkpoint_id} at {location}, created {time.ctime(manifest.created_at)}, "
        f"method {manifest.method}"
        + (f", reads objects of {', '.join(manifest.references)}" if manifest.references else "")
    )
    print(
        table(
            ["participant", "role", "records", "reused", "bytes", "written", "manifest"],
            [
                [
                    p.participant_id,
                    p.role,
                    p.records,
                    p.reused,
                    human_bytes(p.bytes),
                    human_bytes(p.written_bytes),
                    p.manifest_key,
                ]
                for p in manifest.participants
            ],
        )
    )
    print(
        f"episodes continued: {len(manifest.episodes or [])}; timings: "
        + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in manifest.timings.items())
    )
    restores = store.decisions(args.checkpoint_id)
    if restores:
        print(table(["restore id", "decision", "decided by"], [list(r) for r in restores]))
    return 0


def _restoring_locally(args: argparse.Namespace, checkpoint_id: str) -> list[str]:
    """Participants of the local stack (when one runs) restoring this checkpoint right now."""
    try:
        _running(args)
    except StackError:
        return []

    async def work(coordinator: Coordinator, _state):
        return restoring(await coordinator.status(), checkpoint_id)

    return asyncio.run(_with_coordinator(args, work, running_only=True))


def cmd_checkpoints_delete(args: argparse.Namespace) -> int:
    try:
        location = _location(args)
        busy = _restoring_locally(args, args.checkpoint_id)
        if busy:
            return _fail(
                "checkpoints delete",
                StackError(
                    f"{', '.join(busy)} of the running stack are restoring {args.checkpoint_id}; "
                    "wait for the restore to finish (`gymckpt status`), then delete"
                ),
            )
        store = CheckpointStore(open_storage(location, _storage_config(args)))
        deleted = store.delete(args.checkpoint_id, by=f"gymckpt checkpoints delete on {socket.gethostname()}")
    except (StackError, StorageError, CheckpointInFlight, InvalidState) as exc:
        return _fail("checkpoints delete", _storage_hint(args, exc))
    if deleted.objects == 0 and not deleted.kept:
        return _fail(
            "checkpoints delete",
            StackError(f"no checkpoint {args.checkpoint_id} at {location}; see `gymckpt checkpoints list`"),
        )
    what = "checkpoint" if deleted.published else "incomplete checkpoint"
    print(
        f"deleted {what} {args.checkpoint_id} at {location}: {deleted.objects} objects"
        + (
            f"; {deleted.kept} kept while other checkpoints read them (`gymckpt checkpoints prune` removes them "
            "once none does)"
            if deleted.kept
            else ""
        )
    )
    return 0


def cmd_checkpoints_prune(args: argparse.Namespace) -> int:
    try:
        location = _location(args)
        pruned = CheckpointStore(open_storage(location, _storage_config(args))).prune()
    except (StackError, StorageError, InvalidState) as exc:
        return _fail("checkpoints prune", _storage_hint(args, exc))
    for deleted in pruned:
        print(
            f"removed {deleted.objects} objects of {deleted.checkpoint_id}"
            + (f" ({deleted.kept} still read by other checkpoints)" if deleted.kept else "")
        )
    print(f"pruned {len(pruned)} checkpoints at {location} that will never be published")
    return 0
