"""``llama_cpp_worker``: llama.cpp's ``llama-server`` as a stack's inference worker.

A local stack starts every server as ``gymckpt serve NAME`` on a listening socket it made (so no other
process can take the port between picking it and serving on it). llama-server binds its own sockets, so
this server runs it as a child process on a Unix socket in a private folder and forwards every request
of its own port to it: the policy model talks to this server exactly as it would to llama-server
(``upstream.engine: llama.cpp``), and the stack's readiness, liveness and metrics routes are the usual
ones. The child is in this server's process group and dies with it (SIGKILL of the group, or of this
process: the kernel's parent-death signal); when the child dies on its own, this server stops too, so
``gymckpt status`` shows it down and ``gymckpt up`` starts both again.

``model: tiny`` serves the tiny generated model (``tiny_model.py``, made in ``$GYMCKPT_CACHE`` on first
use); any other value is the path of a GGUF file.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from pydantic import Field
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gym_services.base.config import CheckpointConfig, ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.participant import NothingToRestore
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.llama_cpp.server import find_llama_server, llama_server_command
from gym_services.server.app import create_server_app

log = get_logger("llama_cpp_worker")
#: request headers forwarded to llama-server (the rest are this hop's own)
FORWARDED = ("content-type", "accept", "authorization")
#: response headers not copied back (the response is framed again here)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})
PR_SET_PDEATHSIG = 1


class Config(ServerConfig):
    checkpoint: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(enabled=False))
    model: str = Field(
        default="tiny",
        description="a GGUF file, or tiny: the tiny generated model (4,096-token byte-level BPE, 2-layer llama, random "
        "weights), made in $GYMCKPT_CACHE on first use",
    )
    context: int = Field(
        default=8192,
        ge=256,
        le=131072,
        description="tokens of a generation (prompt + generated); llama-server runs one at a time, bit for bit "
        "independent of the others (docs/operations/engines.md), keeping each one's KV state in its prompt cache",
    )
    threads: int = Field(default=1, ge=1, le=64, description="CPU threads of llama-server")
    ready_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="how long llama-server may take to load")


class WorkerParticipant(NothingToRestore):
    """The worker keeps no rollout state; if checkpointing is switched on it takes part as stateless."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.STATELESS
    checkpoint_verify = VerifyMode.REPLAY


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGKILL when this server dies, however it dies (Linux; elsewhere the process group does it)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def model_path(model: str) -> Path:
    if model == "tiny":
        from gym_services.models.llama_cpp.tiny_model import ensure_tiny_model

        return ensure_tiny_model().gguf
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"model {model!r} is neither tiny nor a GGUF file")
    return path


class LlamaChild:
    """The llama-server child process on a Unix socket."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.folder = Path(tempfile.mkdtemp(prefix="gymckpt-llama-"))
        self.socket = self.folder / "llama.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)), base_url="http://llama-server", timeout=None
        )
        self._watch: asyncio.Task[None] | None = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        command = llama_server_command(
            find_llama_server(),
            model_path(self.config.model),
            0,
            host=str(self.socket),
            context=self.config.context,
            threads=self.config.threads,
        )
        # its output goes where this server's goes (the stack's log file)
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.config.ready_timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"llama-server exited with {self.process.returncode} while loading its model")
            with contextlib.suppress(httpx.HTTPError):
                if (await self.client.get("/health")).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server was not ready within {self.config.ready_timeout_s:.0f}s")
            await asyncio.sleep(0.05)
        log.info("llama-server ready", extra={"pid": self.process.pid, "model": self.config.model})
        self._watch = asyncio.create_task(self._watch_child())

    async def _watch_child(self) -> None:
        """A child that died on its own takes this server down with it (nothing left to serve)."""
        while self.alive():
            await asyncio.sleep(0.2)
        log.error("llama-server exited; stopping", extra={"returncode": self.process and self.process.returncode})
        os.kill(os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await self.client.aclose()
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                await asyncio.to_thread(self.process.wait, 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait, 10)
        shutil.rmtree(self.folder, ignore_errors=True)


def create_app(config: Config) -> Starlette:
    child = LlamaChild(config)

    async def forward(request: Request) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
        outgoing = child.client.build_request(request.method, path, content=await request.body(), headers=headers)
        try:
            answer = await child.client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            raise ApiError(ErrorCode.NOT_READY, f"llama-server is not answering: {exc}") from None
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP},
            background=BackgroundTask(answer.aclose),
        )

    return create_server_app(
        config,
        WorkerParticipant(),
        [Route("/{path:path}", forward, methods=["GET", "POST"])],
        on_startup=[child.start],
        on_shutdown=[child.stop],
        ready=child.alive,
    )
