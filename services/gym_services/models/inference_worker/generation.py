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
import codecs
import contextlib
import hashlib
import json
import mmap
import os
import struct
import time
from array import array
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
from gym_services.models.inference_worker import tokenizer
from gym_services.models.inference_worker.chat import ChatCompletionRequest, CompletionRequest, Sampling
from gym_services.models.inference_worker.policies import Conversation, Policy, Turn


@dataclass
class Plan:
    """What one request will emit: token ids (a natural stop ends in EOS), their log-probs and texts."""

    completion_id: str
    model: str
    kind: str  # "chat" (chat.completion) or "completion" (text_completion)
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    #: per token: the ``top_logprobs`` alternatives (id, log-prob), best first, when asked for
    top: list[list[tuple[int, float]]]
    texts: list[str]
    finish_reason: str
    logprobs: bool
    as_token_ids: bool
    return_token_ids: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def tool_calls(self) -> list[dict[str, Any]]:
        """Complete tool calls of the whole assistant message, OpenAI form (chat only: vLLM's completions
        route parses none)."""
        if self.kind != "chat":
            return []
        calls = tool_markup.parse(self.text).tool_calls
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

    def token_name(self, token: int) -> str:
        return f"token_id:{token}" if self.as_token_ids else tokenizer.token_bytes(token).decode("utf-8", "replace")

    def chat_logprobs(self, index: int) -> dict[str, Any]:
        """``choices[0].logprobs.content[...]`` entry of token ``index`` (vLLM's chat form)."""
        token = self.token_ids[index]
        return {
            "token": self.token_name(token),
            "logprob": self.log_probs[index],
            "bytes": list(tokenizer.token_bytes(token)),
            "top_logprobs": [
                {"token": self.token_name(t), "logprob": lp, "bytes": list(tokenizer.token_bytes(t))}
                for t, lp in self.top[index]
            ],
        }

    def completion_logprobs(self, indices: range, offset: int) -> dict[str, Any]:
        """``choices[0].logprobs`` of tokens ``indices`` (the legacy completions form; the chosen token is
        always in ``top_logprobs``, as OpenAI's legacy API does)."""
        tops, offsets, at = [], [], offset
        for i in indices:
            entry = {self.token_name(t): lp for t, lp in self.top[i]}
            entry.setdefault(self.token_name(self.token_ids[i]), self.log_probs[i])
            tops.append(entry)
            offsets.append(at)
            at += len(self.texts[i])
        return {
            "tokens": [self.token_name(self.token_ids[i]) for i in indices],
            "token_logprobs": [self.log_probs[i] for i in indices],
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def _advance(state: bytes, token: int) -> bytes:
    return hashlib.blake2b(state + token.to_bytes(5, "little"), digest_size=16).digest()


def _unit(state: bytes, token: int, salt: bytes) -> float:
    digest = hashlib.blake2b(state + token.to_bytes(5, "little") + salt, digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def _float32(value: float) -> float:
    """A log-prob as an engine reports it: computed in float32 (vLLM's are float32 values in JSON)."""
    return float(array("f", (value,))[0])


def score(
    context: list[int], tokens: list[int], sampling_key: str, top_k: int
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The log-prob the stand-in model gives each of ``tokens`` after ``context`` and the tokens before it,
    and ``top_k`` alternatives per position.

    The policy decides the text; the log-probs are a deterministic function of the whole context's token
    ids (a hash chain over every id before the token), the token and the sampling settings (seed and
    temperature), each a float32 value as a real engine reports it. So a token after a differently tokenized
    prefix gets a different log-prob, exactly as a real model's would, and the same ids always give the same
    log-probs (seeded sampling repeats).
    """
    state = hashlib.blake2b(sampling_key.encode(), digest_size=16).digest()
    for token in context:
        state = _advance(state, token)
    log_probs: list[float] = []
    top: list[list[tuple[int, float]]] = []
    for token in tokens:
        u = _unit(state, token, b"chosen")
        lp = _float32(-0.0001 - 6.0 * u**3)
        log_probs.append(lp)
        alternatives: list[tuple[int, float]] = []
        if top_k:
            alternatives.append((token, lp))
            for j in range(1, top_k):
                alt = 16 + int(_unit(state, j, b"alt") * 256)
                if alt == token:
                    alt = 16 + (alt - 15) % 256
                alternatives.append((alt, _float32(alternatives[-1][1] - 0.1 - _unit(state, j, b"gap"))))
        top.append(alternatives)
        state = _advance(state, token)
    return log_probs, top


def _texts(before: bytes, tokens: list[int]) -> list[str]:
    """The text each token adds after ``before`` (the answer's bytes so far): a token ending inside a
    multi-byte character adds ``""``, the one completing it the whole character; specials add nothing."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(before)
    return ["" if t in tokenizer.SPECIAL else decoder.decode(tokenizer.token_bytes(t)) for t in tokens]


def _plan(
    kind: str,
    request: Sampling,
    policy: Policy,
    prompt_ids: list[int],
    turns: list[tuple[str, str]],
    tools: list[dict[str, Any]] | None,
    answer_ids: list[int],
    logprobs: bool,
    top_k: int,
) -> Plan:
    conversation = Conversation(tuple(Turn(role, text) for role, text in turns), tokenizer.tool_names(tools))
    full = policy.respond(conversation)
    full_ids = tokenizer.encode(full)
    answer = tokenizer.decode_bytes(answer_ids)
    if full_ids[: len(answer_ids)] == answer_ids:
        rest = full_ids[len(answer_ids) :]
    elif full.encode().startswith(answer):  # the same text, tokenized otherwise: go on from its bytes
        rest = tokenizer.encode_rest(full, len(answer))
    else:
        raise ApiError(
            ErrorCode.PREFIX_MISMATCH,
            f"the prompt's assistant answer so far ({len(answer_ids)} tokens) is not a prefix of what policy "
            f"{policy.name!r} writes for this conversation",
        )
    finish = "tool_calls" if kind == "chat" and tool_markup.parse(full).tool_calls else "stop"
    tokens = [*rest, tokenizer.EOS]
    limit = request.token_limit()
    if limit is not None and len(tokens) > limit:
        tokens, finish = tokens[:limit], "length"
    log_probs, top = score(prompt_ids, tokens, request.sampling_key(), top_k)
    # stream settings do not change what is generated: both forms get the same ids
    semantic = request.model_dump(mode="json", exclude={"stream", "stream_options"})
    digest = hashlib.sha256(canonical_json(semantic)).hexdigest()
    return Plan(
        completion_id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{digest[:24]}",
        model=request.model,
        kind=kind,
        prompt_ids=prompt_ids,
        token_ids=tokens,
        log_probs=log_probs,
        top=top,
        texts=_texts(answer, tokens),
        finish_reason=finish,
        logprobs=logprobs,
        as_token_ids=request.return_tokens_as_token_ids,
        return_token_ids=request.return_token_ids,
    )


def plan_chat(request: ChatCompletionRequest, policy: Policy) -> Plan:
    """A chat completion: the messages rendered with the template, the policy's whole answer."""
    prompt = tokenizer.render_chat(request.turns(), request.tools, request.add_generation_prompt)
    top_k = (request.top_logprobs or 0) if request.logprobs else 0
    return _plan("chat", request, policy, prompt, request.turns(), request.tools, [], request.logprobs, top_k)


def plan_text_completion(request: CompletionRequest, policy: Policy) -> Plan:
    """A completion from a token-id prompt: a rendered chat and the answer's ids so far, continued."""
    try:
        parsed = tokenizer.parse_prompt(request.prompt)
    except (ValueError, json.JSONDecodeError) as exc:
        raise ApiError(ErrorCode.BAD_REQUEST, f"prompt: not a chat prompt of this worker's template: {exc}") from None
    wants = request.logprobs is not None
    return _plan(
        "completion",
        request,
        policy,
        list(request.prompt),
        parsed.turns,
        parsed.tools,
        parsed.answer_ids,
        wants,
        request.logprobs or 0,
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
            metrics.counter(
                "gym_worker_requests", "Chat completion requests by outcome", ("model", "stream", "outcome")
            ),
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

    def counts(self) -> dict[str, Any]:
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
        process is SIGKILLed next; a process's own write buffer dies with it), unless the client left.

        A client that half-closed is still sent what was buffered: its end-of-stream makes asyncio ``close()``
        the transport (uvicorn keeps nothing open on EOF), which writes the buffer out before it reports the
        connection lost; only a write error (a client that reset, so did not keep reading) drops it."""
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

    def __init__(self, plan: Plan, request: Sampling, pace: Pace, stats: WorkerStats) -> None:
        self.plan = plan
        self.stream = request.stream
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        self.pace = pace
        self.stats = stats

    async def _turn(self, start: float, index: int, gone: asyncio.Event) -> bool:
        """Wait until step ``index`` is due; False if the client left meanwhile."""
        delay = self.pace.due(start, index) - asyncio.get_running_loop().time()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), delay)
        else:
            await asyncio.sleep(0)
        return not gone.is_set()

    async def _tokens(self, connection: Connection, count: bool = True) -> AsyncIterator[int]:
        """The token indices, each at its turn (a natural stop's last token is the EOS).

        The generator ends early when the client leaves; callers compare counts to notice. Each index is
        yielded right after the connection was seen open; with ``count`` it is counted here, else the
        caller counts it once written (streaming: see :meth:`_send_stream`).
        """
        gone = connection.gone
        start = asyncio.get_running_loop().time()
        for index in range(len(self.plan.token_ids)):
            if not await self._turn(start, index, gone):
                return
            await connection.writable()
            if not connection.open():
                return
            if count:
                self.stats.generated(self.plan.model)
            yield index

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

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.plan.completion_id, "object": obj, "created": self.plan.created, "model": self.plan.model}

    def _chunk(self, index: int | None, finish: str | None, emitted: int, offset: int = 0) -> dict[str, Any]:
        """The chunk of token ``index`` (None: the chat's opening role chunk)."""
        plan = self.plan
        last = index is not None and index == len(plan.token_ids) - 1
        choice: dict[str, Any] = {"index": 0}
        if plan.kind == "chat":
            chunk = self._envelope("chat.completion.chunk")
            if index is None:
                choice["delta"] = {"role": "assistant", "content": ""}
                if plan.return_token_ids:
                    chunk["prompt_token_ids"] = plan.prompt_ids
            else:
                choice["delta"] = {"content": plan.texts[index]}
                calls = plan.tool_calls() if last else []
                if calls:
                    choice["delta"]["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
            choice["logprobs"] = (
                {"content": [plan.chat_logprobs(index)]} if plan.logprobs and index is not None else None
            )
        else:
            chunk = self._envelope("text_completion")
            choice["text"] = plan.texts[index] if index is not None else ""
            choice["logprobs"] = (
                plan.completion_logprobs(range(index, index + 1), offset)
                if plan.logprobs and index is not None
                else None
            )
            if plan.return_token_ids and index == 0:
                choice["prompt_token_ids"] = plan.prompt_ids
        choice["finish_reason"] = finish
        if plan.return_token_ids and index is not None:
            choice["token_ids"] = [plan.token_ids[index]]
        chunk["choices"] = [choice]
        if self.continuous_usage:
            chunk["usage"] = plan.usage(emitted)
        return chunk

    async def _send_stream(self, send: Send, connection: Connection) -> bool:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        plan = self.plan
        if plan.kind == "chat":
            await body(_sse(self._chunk(None, None, 0)))
        emitted = 0
        offset = 0
        async for index in self._tokens(connection, count=False):
            emitted += 1
            last = index == len(plan.token_ids) - 1
            await body(_sse(self._chunk(index, plan.finish_reason if last else None, emitted, offset)))
            offset += len(plan.texts[index])
            # counted once it left this process: a token counted is a token the client gets, even if this process
            # is SIGKILLed right after (the token mirror, read after such a kill, counted one more before: the
            # token being encoded and written when the kill landed, which the client never got and another worker
            # generated again)
            await connection.flushed()
            self.stats.generated(plan.model)
        if emitted < len(plan.token_ids) or not connection.open():
            await body(b"", more=False)
            return False
        if self.include_usage:
            usage_chunk = self._envelope("chat.completion.chunk" if plan.kind == "chat" else "text_completion")
            usage_chunk["choices"] = []
            usage_chunk["usage"] = plan.usage(emitted)
            await body(_sse(usage_chunk))
        await body(_sse("[DONE]"), more=False)
        return True

    async def _send_whole(self, send: Send, connection: Connection) -> bool:
        indices = [index async for index in self._tokens(connection)]
        plan = self.plan
        if len(indices) < len(plan.token_ids) or not connection.open():
            return False  # the client left; nobody to answer
        choice: dict[str, Any] = {"index": 0}
        if plan.kind == "chat":
            body = self._envelope("chat.completion")
            message: dict[str, Any] = {"role": "assistant", "content": plan.text}
            calls = plan.tool_calls()
            if calls:  # as vLLM with a tool-call parser answers: the calls parsed out, the text before them
                message["tool_calls"] = calls
                message["content"] = tool_markup.parse(plan.text).content or None
            choice["message"] = message
            choice["logprobs"] = {"content": [plan.chat_logprobs(i) for i in indices]} if plan.logprobs else None
            if plan.return_token_ids:
                body["prompt_token_ids"] = plan.prompt_ids
        else:
            body = self._envelope("text_completion")
            choice["text"] = plan.text
            choice["logprobs"] = plan.completion_logprobs(range(len(indices)), 0) if plan.logprobs else None
            if plan.return_token_ids:
                choice["prompt_token_ids"] = plan.prompt_ids
        choice["finish_reason"] = plan.finish_reason
        if plan.return_token_ids:
            choice["token_ids"] = list(plan.token_ids)
        body["choices"] = [choice]
        body["usage"] = plan.usage(len(indices))
        data = json.dumps(body, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})
        return True
