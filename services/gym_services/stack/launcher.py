"""Start and stop a stack's servers as local uvicorn processes, and remember them in a state file.

A stack started for ``gymckpt up`` has a supervisor too (:mod:`gym_services.stack.supervisor`, started by
:func:`gym_services.stack.supervision.start_supervisor`): its servers then hold their state on SIGTERM for the
termination grace, so that it can take a final checkpoint. Stopping a stack here (:func:`stop_stack`) takes none: the
supervisor is stopped first, then every server with SIGINT (or SIGKILL), which a server never holds for.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel

from gym_services.base.config import ConfigError, StorageConfig
from gym_services.stack import children
from gym_services.stack.config import StackConfig, check_stack, substitute_urls
from gym_services.stack.external import ExternalServer, OutsideError, check_external, check_literal_urls, origin
from gym_services.stack.objectstore import EMBEDDED_S3, REGION, LocalS3, ObjectStoreError, start_local_s3, stop_local_s3
from gym_services.stack.objectstore import location as embedded_location
from gym_services.stack.schedule import CheckpointSettings

STATE_FILE = "stack.json"
SECRETS_FILE = "secrets.json"


class RunningServer(BaseModel):
    name: str  # the process (participant id): the server's name, or name-<ordinal> for a replica
    server: str
    url: str
    port: int
    pid: int
    participant: bool
    log: str
    #: the process's start time (clock ticks after boot, /proc): a pid reused by another process is not this server
    started: int | None = None
    group: str | None = None  # the stack YAML's server name; None: the same as name
    ordinal: int = 0
    replicas: int = 1

    @property
    def group_name(self) -> str:
        return self.group or self.name


class SupervisorProcess(BaseModel):
    """The stack's supervisor (:mod:`gym_services.stack.supervisor`)."""

    pid: int
    started: int | None = None  # its start time (clock ticks after boot): a reused pid is not it
    log: str


class StackState(BaseModel):
    name: str
    state_dir: str
    storage: str
    servers: list[RunningServer]
    object_store: LocalS3 | None = None  # the local S3 store of ``storage: embedded-s3``
    external: list[ExternalServer] = []  # servers the stack did not start (stack/external.py)
    #: how the stack checkpoints itself (its schedule, keep, the termination grace); None: not supervised
    checkpoint: CheckpointSettings | None = None
    supervisor: SupervisorProcess | None = None

    def participants(self) -> list[RunningServer]:
        return [s for s in self.servers if s.participant]

    def url(self, name: str) -> str:
        """The URL of one process: by its name, or by its server's name when that server has one replica."""
        for server in self.servers:
            if server.name == name:
                return server.url
        urls = self.urls(name)
        if len(urls) > 1:
            raise KeyError(f"server {name!r} of stack {self.name} has {len(urls)} replicas; name one ({name}-0, ...)")
        return urls[0]

    def urls(self, group: str) -> list[str]:
        """The URLs of a server's replicas, in ordinal order."""
        found = sorted((s for s in self.servers if s.group_name == group), key=lambda s: s.ordinal)
        if not found:
            raise KeyError(f"no server {group!r} in stack {self.name}")
        return [s.url for s in found]

    def replicas_of(self, group: str) -> list[RunningServer]:
        return sorted((s for s in self.servers if s.group_name == group), key=lambda s: s.ordinal)


class StackError(RuntimeError):
    """A stack could not start or is not running."""


def listen(name: str, port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (``port`` 0: any free one), handed to the server's process as its
    ``--fd``: the port is ours from this moment, so no other process on the machine (another stack, a test
    run in parallel) can take it before the server starts and answer its readiness checks instead."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise StackError(f"cannot listen on 127.0.0.1:{port} for {name}: {exc.strerror or exc}") from None
    return sock


def _spawn(
    server: str, config_path: Path, sock: socket.socket, env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``gymckpt serve`` on the listening socket ``sock`` (our copy is closed once the child has it), its
    output appended to ``log_path`` (the child writes to its own copy of the descriptor)."""
    try:
        with open(log_path, "ab") as log:
            return children.keep(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gym_services.cli",
                        "serve",
                        server,
                        "--config",
                        str(config_path),
                        "--fd",
                        str(sock.fileno()),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    pass_fds=(sock.fileno(),),
                )
            )
    finally:
        sock.close()


def stack_secrets(state_dir: Path) -> dict[str, str]:
    """The stack's control token, session secret and local-S3 keys, created once and kept (restored
    cookies need the same session secret; the local store's data needs the same keys)."""
    path = state_dir / SECRETS_FILE
    values: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    wanted: dict[str, Callable[[], str]] = {
        # a token exported before the first `up` (GYMCKPT_CONTROL_TOKEN) is the stack's: external servers share it
        "control_token": lambda: os.environ.get("GYMCKPT_CONTROL_TOKEN") or secrets.token_urlsafe(32),
        "session_secret": lambda: secrets.token_urlsafe(32),
        "s3_access_key": lambda: "gymckpt" + secrets.token_hex(8),
        "s3_secret_key": lambda: secrets.token_urlsafe(30),
    }
    missing = {key: make() for key, make in wanted.items() if key not in values}
    if missing:
        values.update(missing)
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(values, fh)
        os.replace(tmp, path)
    return values


def storage_env(state: StackState) -> dict[str, str]:
    """AWS variables that reach the stack's local S3 store (empty when it has none)."""
    if state.object_store is None:
        return {}
    creds = stack_secrets(Path(state.state_dir))
    return state.object_store.env(creds["s3_access_key"], creds["s3_secret_key"])


def stack_storage_config(state: StackState) -> StorageConfig:
    """How the stack's own location is reached: its local S3 store, else the AWS variables (``AWS_ENDPOINT_URL``)."""
    if state.object_store is None:
        return StorageConfig(endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    creds = stack_secrets(Path(state.state_dir))
    return StorageConfig(
        endpoint_url=state.object_store.endpoint,
        region=REGION,
        access_key_id=creds["s3_access_key"],
        secret_access_key=creds["s3_secret_key"],
    )


def write_state(state: StackState) -> None:
    path = Path(state.state_dir) / STATE_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json(indent=1))
    os.replace(tmp, path)


def read_state(state_dir: Path) -> StackState:
    path = state_dir / STATE_FILE
    if not path.exists():
        raise StackError(f"no running stack in {state_dir} (run `gymckpt up CONFIG` first)")
    return StackState.model_validate_json(path.read_text())


def alive(pid: int) -> bool:
    """Process ``pid`` exists and has not exited: a zombie (exited, waiting for its parent to reap it - a server
    whose launcher is gone waits for the init process) is not alive. A killed server's main thread is a zombie while
    its other threads still exit, holding its files (its listening socket) until the last one is gone: alive until
    then, or a restart on the same port would find it in use."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            return True
    except (OSError, IndexError):
        return True  # no /proc: the signal's answer is all there is
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot); None without /proc or once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_running(server: RunningServer | SupervisorProcess) -> bool:
    """The server's process is still there - its pid, and (where /proc tells) the same process: a server that died
    long ago leaves its pid to be reused (pids wrap at 32768 on many machines), and signalling that pid's group
    would kill someone else's processes."""
    if not alive(server.pid):
        return False
    return server.started is None or start_time(server.pid) in (None, server.started)


def start_stack(
    stack: StackConfig,
    base: Path,
    *,
    ready_timeout_s: float = 60.0,
    log_level: str = "warning",
    say: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
    supervise: bool = False,
) -> StackState:
    """Start every server (and the local object store of ``storage: embedded-s3``), wait until each is
    ready, write the state file. ``env`` is added to every server's environment (e.g. AWS_* of a store).

    ``supervise``: the stack will have a supervisor (:func:`gym_services.stack.supervision.start_supervisor`, once
    the stack is restored if it resumes): every participant holds its state on SIGTERM for the stack's termination
    grace (``stack.checkpoint``), and the state file carries the settings the supervisor runs by."""
    state_dir = stack.resolved_state_dir(base)
    _refuse_running(stack, state_dir)
    try:
        check_stack(stack, stack.name)
    except ConfigError as exc:
        raise StackError(str(exc)) from None
    creds = stack_secrets(state_dir)
    outside = _outside(stack, creds["control_token"])
    (state_dir / "configs").mkdir(parents=True, exist_ok=True)
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    sockets = _listen_all(stack)
    # keys are <location>/checkpoints/<id>/..., so the default location is the state folder itself
    storage = stack.storage or f"file://{state_dir}"
    server_env = {
        **os.environ,
        **(env or {}),
        "GYMCKPT_CONTROL_TOKEN": creds["control_token"],
        "GYMCKPT_SESSION_SECRET": creds["session_secret"],
        "PYTHONUNBUFFERED": "1",
    }
    store: LocalS3 | None = None
    if stack.storage == EMBEDDED_S3:
        try:
            store = start_local_s3(state_dir / "s3", creds["s3_access_key"], creds["s3_secret_key"], say=say)
        except ObjectStoreError as exc:
            for sock in sockets.values():
                sock.close()
            raise StackError(str(exc)) from None
        storage = embedded_location(stack.name)
        server_env.update(store.env(creds["s3_access_key"], creds["s3_secret_key"]))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        grace = stack.checkpoint.termination_grace if supervise else None
        running = _spawn_all(stack, state_dir, sockets, server_env, log_level, procs, outside, grace)
        wait_ready(running, procs, ready_timeout_s)
    except BaseException:
        for sock in sockets.values():
            sock.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if store is not None:
            stop_local_s3(state_dir / "s3")
        raise
    state = StackState(
        name=stack.name,
        state_dir=str(state_dir),
        storage=storage,
        servers=running,
        object_store=store,
        external=outside,
        checkpoint=stack.checkpoint if supervise else None,
    )
    write_state(state)
    return state


def _refuse_running(stack: StackConfig, state_dir: Path) -> None:
    if (state_dir / STATE_FILE).exists():
        previous = read_state(state_dir)
        if any(is_running(s) for s in previous.servers):
            raise StackError(
                f"stack {stack.name} is already running in {state_dir}; `gymckpt down` first "
                "(`gymckpt restart NAME` starts one server again)"
            )


def _listen_all(stack: StackConfig) -> dict[str, socket.socket]:
    """A listening socket for every process of the stack, by process name (all closed if one cannot listen)."""
    sockets: dict[str, socket.socket] = {}
    try:
        for name, spec in stack.servers.items():
            if spec.external is not None:  # not started here
                continue
            for instance in spec.instances(name):
                sockets[instance] = listen(instance, spec.port or 0)
    except StackError:
        for sock in sockets.values():
            sock.close()
        raise
    return sockets


def _spawn_all(
    stack: StackConfig,
    state_dir: Path,
    sockets: dict[str, socket.socket],
    env: dict[str, str],
    log_level: str,
    procs: list[subprocess.Popen[bytes]],
    outside: Sequence[ExternalServer] = (),
    grace_s: float | None = None,
) -> list[RunningServer]:
    """Write every process's config (the other servers' URLs filled in, ``outside``'s too, a participant's termination
    grace ``grace_s``) and start it on its socket (taken out of ``sockets``); each process started is added to
    ``procs`` at once, so a failure can stop those."""
    ports = {instance: sock.getsockname()[1] for instance, sock in sockets.items()}
    started = {name: spec for name, spec in stack.servers.items() if spec.external is None}
    # a server with replicas is the list of its replicas' URLs, in ordinal order
    urls: dict[str, str | list[str]] = {
        name: [f"http://127.0.0.1:{ports[i]}" for i in spec.instances(name)]
        if spec.replicas > 1
        else f"http://127.0.0.1:{ports[name]}"
        for name, spec in started.items()
    }
    urls.update({server.name: server.url for server in outside})
    running: list[RunningServer] = []
    for group, spec in started.items():
        assert spec.server is not None
        for ordinal, name in enumerate(spec.instances(group)):
            config = substitute_urls(spec.config, urls)
            # every replica has the server's name (metrics, cookies); the process name is its participant id
            config.update({"name": group, "host": "127.0.0.1", "port": ports[name], "log_level": log_level})
            if grace_s is not None:  # a backend too: the participants calling it reach their boundaries meanwhile
                # (``enabled`` first: a backend's own default, off, must not turn into a participant's)
                own = {"enabled": spec.participant, **config.get("checkpoint", {})}
                config["checkpoint"] = {**own, "termination_grace_s": grace_s}
            config_path = state_dir / "configs" / f"{name}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            log_path = state_dir / "logs" / f"{name}.log"
            proc = _spawn(
                spec.server, config_path, sockets.pop(name), {**env, "GYMCKPT_PARTICIPANT_ID": name}, log_path
            )
            procs.append(proc)
            running.append(
                RunningServer(
                    name=name,
                    server=spec.server,
                    url=f"http://127.0.0.1:{ports[name]}",
                    port=ports[name],
                    pid=proc.pid,
                    participant=spec.participant,
                    log=str(log_path),
                    started=start_time(proc.pid),
                    group=group if spec.replicas > 1 else None,
                    ordinal=ordinal,
                    replicas=spec.replicas,
                )
            )
    return running


def _outside(stack: StackConfig, token: str) -> list[ExternalServer]:
    """The stack's external servers, each what the YAML says it is; no URL in a config names a server outside the
    stack that it would not checkpoint (:mod:`gym_services.stack.external`). :class:`StackError` otherwise."""
    try:
        outside = [
            check_external(name, spec.external, spec.participant, token)
            for name, spec in stack.servers.items()
            if spec.external is not None
        ]
        configs = {name: spec.config for name, spec in stack.servers.items() if spec.external is None}
        check_literal_urls(configs, {origin(s.url): s.name for s in outside}, token)
    except OutsideError as exc:
        raise StackError(str(exc)) from None
    return outside


def restart_server(
    state_dir: Path, name: str, *, ready_timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> RunningServer:
    """Start one server of a running stack again, from its saved config on its own port (a restarted pod).

    The old process must be gone (killed or crashed); the state file gets the new pid."""
    state = read_state(state_dir)
    index = next((i for i, s in enumerate(state.servers) if s.name == name), None)
    if index is None:
        raise StackError(f"no server {name!r} in stack {state.name}")
    old = state.servers[index]
    if is_running(old):
        _reap(old.pid)
        if is_running(old):
            raise StackError(f"{name} is still running (pid {old.pid}); stop it first")
    creds = stack_secrets(state_dir)
    proc_env = {
        **os.environ,
        **storage_env(state),
        **(env or {}),
        "GYMCKPT_CONTROL_TOKEN": creds["control_token"],
        "GYMCKPT_SESSION_SECRET": creds["session_secret"],
        "GYMCKPT_PARTICIPANT_ID": name,
        "PYTHONUNBUFFERED": "1",
    }
    config_path = state_dir / "configs" / f"{name}.yaml"
    proc = _spawn(old.server, config_path, listen(name, old.port), proc_env, Path(old.log))
    server = old.model_copy(update={"pid": proc.pid, "started": start_time(proc.pid)})
    try:
        wait_ready([server], [proc], ready_timeout_s)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    state.servers[index] = server
    write_state(state)
    return server


def start_missing(state_dir: Path, *, ready_timeout_s: float = 60.0) -> tuple[StackState, list[str]]:
    """Start again every server of a running stack whose process is gone (crashed, killed), each from its
    saved config on its own port, while the others keep running; returns the new state and their names."""
    state = read_state(state_dir)
    missing = [s.name for s in state.servers if not is_running(s)]
    for name in missing:
        restart_server(state_dir, name, ready_timeout_s=ready_timeout_s)
    return read_state(state_dir), missing


def partly_running(state_dir: Path) -> bool:
    """Some, not all, servers of the stack in ``state_dir`` run."""
    try:
        state = read_state(state_dir)
    except StackError:
        return False
    running = [is_running(s) for s in state.servers]
    return any(running) and not all(running)


def wait_ready(servers: list[RunningServer], procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    import httpx  # here only: `gymckpt checkpoint` reads the state file without it (benchmarks/cli_checkpoint.py)

    deadline = time.monotonic() + timeout_s
    pending = {s.name: (s, p) for s, p in zip(servers, procs, strict=True)}
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while pending and time.monotonic() < deadline:
            for name, (server, proc) in list(pending.items()):
                if proc.poll() is not None:
                    tail = Path(server.log).read_text(errors="replace")[-1500:]
                    raise StackError(f"{name} exited with {proc.returncode} while starting; log tail:\n{tail}")
                try:
                    status = client.get(f"{server.url}/health/ready").status_code
                    if status == 404:  # a backend without the shared base: its root answering is enough
                        status = client.get(f"{server.url}/").status_code
                    if status == 200:
                        del pending[name]
                except httpx.HTTPError:
                    pass
            if pending:
                time.sleep(0.05)
    if pending:
        raise StackError(f"not ready after {timeout_s}s: {', '.join(sorted(pending))}")


def stop_stack(state_dir: Path, *, kill: bool = False, timeout_s: float = 10.0) -> list[str]:
    """Stop the stack without a checkpoint: its supervisor first (SIGINT: it ends what it does), then every server
    with SIGINT (which no server holds for), or SIGKILL everything with ``kill`` (a crash); returns the names of the
    servers that were running.

    The local object store of ``storage: embedded-s3`` is stopped too, always with SIGTERM: it is
    storage, not a server whose crash is being simulated, and its data stays for the next ``up``."""
    state = read_state(state_dir)
    sig = signal.SIGKILL if kill else signal.SIGINT
    stop_supervisor(state, sig, timeout_s=timeout_s)
    stopped = []
    ours = [server for server in state.servers if is_running(server)]  # never a reused pid's group
    for server in ours:
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            continue
        stopped.append(server.name)
    deadline = time.monotonic() + timeout_s
    for server in ours:
        _reap_or_kill(server, deadline)
    if state.object_store is not None:
        stop_local_s3(Path(state.object_store.data_dir))
    return stopped


def stop_supervisor(state: StackState, sig: signal.Signals = signal.SIGINT, *, timeout_s: float = 10.0) -> bool:
    """Stop the stack's supervisor (SIGINT: without a checkpoint; SIGKILL: a crash) and wait until it is gone;
    False when none was running."""
    supervisor = state.supervisor
    if supervisor is None or not is_running(supervisor):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(supervisor.pid, sig)
    _reap_or_kill(supervisor, time.monotonic() + timeout_s)
    return True


def stop_servers_after(state: StackState, deadline_at: float, *, drain_s: float = 2.0, margin_s: float = 3.0) -> None:
    """After a termination: SIGINT to every server still running (one holding a final checkpoint exits at once; one
    that got SIGTERM ignores it and exits at its own deadline), then SIGKILL whatever still runs ``drain_s +
    margin_s`` after ``deadline_at`` (unix time), as a kubelet does after the grace period."""
    ours = [server for server in state.servers if is_running(server)]
    for server in ours:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGINT)
    deadline = time.monotonic() + max(0.0, deadline_at - time.time()) + drain_s + margin_s
    for server in ours:
        _reap_or_kill(server, deadline)


def stop_server(server: RunningServer, *, timeout_s: float = 10.0) -> None:
    """Stop one server's process group with SIGINT (no termination: the stack takes no final checkpoint for it),
    SIGKILL after ``timeout_s``; never a reused pid's group."""
    if not is_running(server):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGINT)
    _reap_or_kill(server, time.monotonic() + timeout_s)


def _reap_or_kill(server: RunningServer | SupervisorProcess, deadline: float) -> None:
    """Wait (reaping) until a signalled server is gone, SIGKILL its process group at ``deadline``."""
    while is_running(server) and time.monotonic() < deadline:
        _reap(server.pid)
        time.sleep(0.02)
    if is_running(server):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        _reap(server.pid)


def _reap(pid: int) -> None:
    children.reap(pid)
