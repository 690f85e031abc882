"""Planning a completion and emitting it token by token at a configured pace.

The policy decides the whole assistant message up front (it is a pure function of the request); the
"generation" is the paced emission of its tokens. A token counts as generated only when it goes out on
a connection the client still reads, so a client that leaves (the policy model cutting a generation by
closing its sending half, or dying) stops generation at once and no token is ever counted for nobody:

- under uvicorn the check is the connection's transport itself (``is_closing()``), which closes in the
  same event-loop step that reads the client's end-of-stream: every token counted was written before
  that, so it reaches a client that keeps reading (the policy model drains a cut stream to its end);
- the ``http.disconnect`` message arrives a few loop steps later; it is only the fallback for servers
  that do not expose their transport.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import mmap
import os
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter
from starlette.types import Receive, Scope, Send

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.metrics import Metrics
from gym_services.control.records import canonical_json
from gym_services.models import tool_markup
from gym_services.models.inference_worker.chat import ChatCompletionRequest, ChatMessage
from gym_services.models.inference_worker.policies import Conversation, Policy, Turn
from gym_services.models.inference_worker.tokenizer import count_tokens, split_at

#: Fixed per-message and assistant-header overheads of the stand-in chat template.
MESSAGE_OVERHEAD = 4
ASSISTANT_HEADER = 3


@dataclass
class Plan:
    """What one request will emit."""

    completion_id: str
    model: str
    prefix: str
    pieces: list[str]
    finish_reason: str
    prompt_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def tool_calls(self) -> list[dict[str, Any]]:
        """Complete tool calls of the whole assistant message (prefix + this completion), OpenAI form."""
        calls = tool_markup.parse(self.prefix + self.text).tool_calls
        return [
            {
                "id": "call_" + hashlib.sha256(f"{self.completion_id}:{i}".encode()).hexdigest()[:24],
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }


def conversation_of(messages: list[ChatMessage], tool_names: tuple[str, ...]) -> Conversation:
    return Conversation(tuple(Turn(m.role, m.raw_text()) for m in messages), tool_names)


def prompt_tokens(history: list[ChatMessage], tools: list[dict[str, Any]] | None, prefix: str) -> int:
    """Prompt size under the stand-in template; a continuation's prompt is the original's plus its prefix."""
    total = sum(MESSAGE_OVERHEAD + count_tokens(m.role) + count_tokens(m.raw_text()) for m in history)
    if tools:
        total += count_tokens(json.dumps(tools, sort_keys=True))
    return total + ASSISTANT_HEADER + count_tokens(prefix)


def plan_completion(request: ChatCompletionRequest, policy: Policy) -> Plan:
    """Run the policy and decide which tokens this request emits (continuation: those after the prefix)."""
    history = list(request.messages)
    prefix = ""
    if request.continue_final_message:
        prefix = history.pop().raw_text()
    full = policy.respond(conversation_of(history, request.tool_names()))
    if not full.startswith(prefix):
        raise ApiError(
            ErrorCode.PREFIX_MISMATCH,
            f"continue_final_message: the assistant prefix ({len(prefix)} chars) is not a prefix of what "
            f"policy {policy.name!r} writes for this conversation",
        )
    pieces = split_at(full, prefix)
    finish = "tool_calls" if tool_markup.parse(full).tool_calls else "stop"
    limit = request.token_limit()
    if limit is not None and len(pieces) > limit:
        pieces, finish = pieces[:limit], "length"
    # stream settings do not change what is generated: both forms get the same ids
    semantic = request.model_dump(mode="json", exclude={"stream", "stream_options"})
    digest = hashlib.sha256(canonical_json(semantic)).hexdigest()
    return Plan(
        completion_id=f"chatcmpl-{digest[:24]}",
        model=request.model,
        prefix=prefix,
        pieces=pieces,
        finish_reason=finish,
        prompt_tokens=prompt_tokens(history, request.tools, prefix),
    )


class TokenMirror:
    """The worker's token count mirrored into a file, readable after the worker died.

    The count is written into a memory-mapped file (8 bytes, little-endian) with every token, so it
    is in the page cache the moment the token is counted and survives a SIGKILL: whoever measures
    failover (the demo, the benchmarks) reads how many tokens a killed worker generated with
    :func:`read_token_mirror`. A streamed token is counted once its bytes left the process for the
    socket (see :meth:`CompletionResponse._send_stream`), so a killed worker's count is what its
    clients receive, but for a kill between that write and the count: no sender can make the two one
    step, and a busy machine can deschedule the worker right between them, which misses one token per
    stream caught there. Where it must be exact, count a killed worker by what its clients received
    (the policy model's fleet counts it per worker; the demo does so).
    """

    SIZE = 8

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.SIZE)
            self._map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)
        self.write(0)

    def write(self, count: int) -> None:
        struct.pack_into("<Q", self._map, 0, count)


def token_mirror_path(stats_dir: str | Path, participant_id: str) -> str:
    """Where a worker with ``stats_dir`` mirrors its token count."""
    return str(Path(stats_dir) / f"{participant_id}.tokens")


def read_token_mirror(path: str) -> int:
    """The token count a worker's mirror file holds (0 when it has none yet)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return 0
    return struct.unpack("<Q", data[: TokenMirror.SIZE])[0] if len(data) >= TokenMirror.SIZE else 0


class WorkerStats:
    """Totals for ``GET /stats`` and the Prometheus counters."""

    @classmethod
    def declare(cls, metrics: Metrics, mirror: TokenMirror | None = None) -> WorkerStats:
        """Stats whose counters are declared on the worker's registry."""
        return cls(
            metrics.counter("gym_worker_tokens_generated", "Completion tokens generated", ("model",)),
            metrics.counter("gym_worker_requests", "Chat completion requests by outcome", ("model", "stream", "outcome")),
            mirror,
        )

    def __init__(self, tokens: Counter, requests: Counter, mirror: TokenMirror | None = None) -> None:
        self.mirror = mirror
        self.tokens_generated = 0
        self.prompt_tokens = 0
        self.requests = 0
        self.active = 0
        self.disconnected = 0
        self.by_model: dict[str, int] = {}
        self._tokens = tokens
        self._requests = requests

    def started(self, plan: Plan) -> None:
        self.requests += 1
        self.active += 1
        self.prompt_tokens += plan.prompt_tokens

    def generated(self, model: str) -> None:
        self.tokens_generated += 1
        if self.mirror is not None:
            self.mirror.write(self.tokens_generated)
        self.by_model[model] = self.by_model.get(model, 0) + 1
        self._tokens.labels(model=model).inc()

    def finished(self, model: str, stream: bool, outcome: str) -> None:
        self.active -= 1
        if outcome == "disconnected":
            self.disconnected += 1
        self._requests.labels(model=model, stream=str(stream).lower(), outcome=outcome).inc()

    def snapshot(self) -> dict[str, Any]:
        return {
            "tokens_generated": self.tokens_generated,
            "prompt_tokens": self.prompt_tokens,
            "requests": self.requests,
            "active": self.active,
            "disconnected": self.disconnected,
            "by_model": dict(self.by_model),
        }


@dataclass(frozen=True)
class Pace:
    time_to_first_token_s: float
    tokens_per_second: float

    def due(self, start: float, index: int) -> float:
        interval = 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0
        return start + self.time_to_first_token_s + index * interval


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


class Connection:
    """Whether the client still receives what this response writes, checked without yielding."""

    def __init__(self, receive: Receive, gone: asyncio.Event) -> None:
        self.gone = gone
        # uvicorn hands the app its request cycle's bound ``receive``; the cycle holds the transport
        transport = getattr(getattr(receive, "__self__", None), "transport", None)
        self.transport: asyncio.WriteTransport | None = (
            transport if isinstance(transport, asyncio.WriteTransport) else None
        )

    def open(self) -> bool:
        if self.gone.is_set():
            return False
        return self.transport is None or not self.transport.is_closing()

    async def flushed(self) -> None:
        """Wait until what was written left this process for the socket (the kernel delivers it even if this
        process is SIGKILLed next; a process's own write buffer dies with it), unless the client left."""
        transport = self.transport
        if transport is None:
            return
        while transport.get_write_buffer_size() > 0 and not transport.is_closing() and not self.gone.is_set():
            await asyncio.sleep(0.002)

    async def writable(self) -> None:
        """Wait while the client reads slower than we write (the server would pause the send)."""
        transport = self.transport
        if transport is None:
            return
        low, _ = transport.get_write_buffer_limits()
        while transport.get_write_buffer_size() > low and not transport.is_closing() and not self.gone.is_set():
            await asyncio.sleep(0.005)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class CompletionResponse:
    """An ASGI response that generates while it sends, and stops when the client goes away."""

    def __init__(self, plan: Plan, request: ChatCompletionRequest, pace: Pace, stats: WorkerStats) -> None:
        self.plan = plan
        self.stream = request.stream
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        self.pace = pace
        self.stats = stats
        self.eos_reached = False

    async def _turn(self, start: float, index: int, gone: asyncio.Event) -> bool:
        """Wait until step ``index`` is due; False if the client left meanwhile."""
        delay = self.pace.due(start, index) - asyncio.get_running_loop().time()
        if delay > 0:
            try:
                await asyncio.wait_for(gone.wait(), delay)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(0)
        return not gone.is_set()

    async def _tokens(self, connection: Connection, count: bool = True) -> AsyncIterator[str]:
        """The pieces, each at its turn; a stop (not ``length``) takes one more step, like an EOS token.

        The generator ends early when the client leaves; callers compare counts to notice. Each piece is
        yielded right after the connection was seen open; with ``count`` it is counted here, else the
        caller counts it once written (streaming: see :meth:`_send_stream`).
        """
        gone = connection.gone
        start = asyncio.get_running_loop().time()
        for index, piece in enumerate(self.plan.pieces):
            if not await self._turn(start, index, gone):
                return
            await connection.writable()
            if not connection.open():
                return
            if count:
                self.stats.generated(self.plan.model)
            yield piece
        if self.plan.finish_reason != "length":
            self.eos_reached = await self._turn(start, len(self.plan.pieces), gone) and connection.open()
        else:
            self.eos_reached = connection.open()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        connection = Connection(receive, gone)
        self.stats.started(self.plan)
        outcome = "disconnected"
        try:
            if self.stream:
                complete = await self._send_stream(send, connection)
            else:
                complete = await self._send_whole(send, connection)
            outcome = "completed" if complete else outcome
        finally:
            watcher.cancel()
            self.stats.finished(self.plan.model, self.stream, outcome)

    def _chunk(self, delta: dict[str, Any], finish: str | None, emitted: int) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.plan.completion_id,
            "object": "chat.completion.chunk",
            "created": self.plan.created,
            "model": self.plan.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.continuous_usage:
            chunk["usage"] = self.plan.usage(emitted)
        return chunk

    async def _send_stream(self, send: Send, connection: Connection) -> bool:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        await body(_sse(self._chunk({"role": "assistant", "content": ""}, None, 0)))
        emitted = 0
        async for piece in self._tokens(connection, count=False):
            emitted += 1
            await body(_sse(self._chunk({"content": piece}, None, emitted)))
            # counted once it left this process: a token counted is a token the client gets, even if this process
            # is SIGKILLed right after (the token mirror, read after such a kill, counted one more before: the
            # token being encoded and written when the kill landed, which the client never got and another worker
            # generated again)
            await connection.flushed()
            self.stats.generated(self.plan.model)
        if not self.eos_reached:
            await body(b"", more=False)
            return False
        calls = self.plan.tool_calls()
        final = {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]} if calls else {}
        await body(_sse(self._chunk(final, self.plan.finish_reason, emitted)))
        if self.include_usage:
            usage_chunk = self._chunk({}, None, emitted)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = self.plan.usage(emitted)
            await body(_sse(usage_chunk))
        await body(_sse("[DONE]"), more=False)
        return True

    async def _send_whole(self, send: Send, connection: Connection) -> bool:
        pieces = [piece async for piece in self._tokens(connection)]
        if not self.eos_reached:
            return False  # the client left; nobody to answer
        message: dict[str, Any] = {"role": "assistant", "content": self.plan.text}
        calls = self.plan.tool_calls()
        if calls:
            message["tool_calls"] = calls
        body = {
            "id": self.plan.completion_id,
            "object": "chat.completion",
            "created": self.plan.created,
            "model": self.plan.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.plan.finish_reason}],
            "usage": self.plan.usage(len(pieces)),
        }
        data = json.dumps(body, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})
        return True
