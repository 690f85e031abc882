"""In-flight generations: streaming, cuts at token boundaries, held responses, staged prefixes.

Lifecycle of one ``/v1/responses`` call (one :class:`Generation`):

``running``  the upstream stream is read chunk by chunk into ``text`` (tool calls in markup form). A
             checkpoint's prepare holds (no stream starts) and its capture takes the generation as far as it
             has streamed, at a token boundary, while the stream goes on: the checkpoint holds that prefix, the
             live call is never interrupted;
``cut``      a final checkpoint's capture asked for a cut (the process exits after it): the upstream is told
             to stop (the sending half of its
             connection is closed, :class:`~.engines.Halt`) and the reader keeps every token that
             still arrives until the upstream ends the stream (bounded by ``cut_wait_s``; past that
             the stream is closed where it is). The upstream counts a token only if it went out
             before it saw the stop, so every token generated is in the prefix: none is generated
             twice or for nobody, however far the reader had fallen behind. The HTTP call stays open;
``held``     the generation finished while a checkpoint was open: the response waits for resume;
then, at resume (or abort), a cut call continues from its :class:`~gym_services.base.tokens.Tokens` — the
prompt's ids as the engine reported them plus every generated id, never re-tokenized text (the engine
adapter's continuation request, :mod:`.engines`) — and returns one response, prefix + continuation, with
the ids and sampled log-probs of both: the response an uninterrupted call returns; a held call is
delivered.

A failing upstream (the worker killed or restarting, a refused connection, a stream broken off, a
``5xx``/``429`` answer) is handled like a cut the generation did not ask for: what arrived stays as
the prefix. With another worker of the fleet up (:mod:`.fleet`), the generation continues its prefix
there at once; otherwise it waits (bounded, doubling backoff, state ``cut``, so it never blocks a
checkpoint) and continues on whatever the upstream is by then: the restarted worker or another one. Only when the
upstream makes no progress for ``UpstreamRetry.deadline_s`` does the call fail, with ``503 upstream_unavailable``; its
prefix is then staged, so the agent re-issuing the same request (it goes back to its boundary and retries) continues
from it.

After a restore, prefixes sit in ``staged`` under (rollout id, request digest) for attempt + 1: the
re-issued request continues from its prefix (or, for a complete one, is answered without generating).
A prefix is used once; if the call using it fails before finishing, what it reached is staged again.

A call whose attempt became stale (retire, a newer attempt of the rollout, a restore of the rollout)
gets ``409 stale_attempt`` at once, whatever state it was in: nothing hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gym_services.base import token_codec
from gym_services.base.backoff import Backoff
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.logs import get_logger
from gym_services.base.metrics import Metrics
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import Tokens
from gym_services.control.participant import InvalidState, RestoredRecord, Scope
from gym_services.models import tool_markup
from gym_services.models.policy_model.engines import Delta, EngineRequest, Halt
from gym_services.models.policy_model.prefixes import Bases, ChunkCuts, Key, StagedPrefix, read_records
from gym_services.models.policy_model.upstream import Upstream, UpstreamRetry, UpstreamUnavailable

log = get_logger("policy_model")


class GenerationState(enum.StrEnum):
    """Where one generation is (the lifecycle above)."""

    RUNNING = "running"
    CUT = "cut"
    HELD = "held"
    DONE = "done"


@dataclass(frozen=True)
class ModelCounters:
    """The policy model's own metrics, declared on its app's registry."""

    tokens_generated: Counter
    tokens_reused: Counter
    responses_held: Counter
    generations_cut: Counter
    upstream_failures: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> ModelCounters:
        return cls(
            tokens_generated=metrics.counter(
                "gym_model_tokens_generated", "Tokens the upstream generated for this model"
            ),
            tokens_reused=metrics.counter(
                "gym_model_tokens_reused", "Prefix tokens a continuation did not regenerate", ("source",)
            ),
            responses_held=metrics.counter("gym_model_responses_held", "Responses held until a checkpoint resumed"),
            generations_cut=metrics.counter("gym_model_generations_cut", "Generations cut at a token boundary"),
            upstream_failures=metrics.counter(
                "gym_model_upstream_failures",
                "Upstream failures a generation rode out (it kept its prefix and retried)",
            ),
        )


class Generation:
    """One ``/v1/responses`` call and the generation behind it."""

    def __init__(
        self,
        manager: GenerationManager,
        identity: RolloutIdentity | None,
        digest: str,
        body: dict[str, Any],
        limit: int | None,
        staged: StagedPrefix | None,
    ) -> None:
        self.manager = manager
        self.identity = identity
        self.digest = digest
        self.body = body
        self.limit = limit
        if staged is not None and staged.tokens is None and not (staged.complete and not manager.token_information):
            # a text-only record (schema 1) has no token ids: continuing it would re-tokenize its text, so the
            # generation starts over (it was never delivered); a complete one still answers when no ids are asked for
            log.warning(
                "a text-only prefix record is generated again from the start",
                extra={"rollout_id": identity.rollout_id if identity else None},
            )
            staged = None
        self.staged = staged
        self.restored = staged is not None
        #: answered from a schema 1 record: text and counts, no token ids
        self.text_only = staged is not None and staged.tokens is None
        self.state: GenerationState = GenerationState.CUT  # until the first stream starts: parked, with an empty prefix
        self.text = ""
        self.structured: dict[int, dict[str, str]] = {}
        self.completion_tokens = 0
        self.prompt_tokens: int | None = None
        #: the prompt as the engine tokenized it (None until the engine reports it; a compact array, 4 bytes an id:
        #: thousands of long prompts are live at once), every generated token id and its sampled log-prob, growing
        #: with each delta: :meth:`tokens` is their value
        self.prompt_token_ids: TokenArray | None = None
        self.generation_token_ids: list[int] = []
        self.generation_log_probs: list[float] = []
        self.finish_reason: str | None = None
        self.error: ApiError | None = None
        self.cut_requested = False
        #: what the next stream continues from: a checkpoint's ``cut`` or an ``upstream_failure``
        self.resumes_after = "cut"
        self.waiting_for_upstream = False
        self._upstream_retry: Backoff | None = None  # made at the first upstream failure
        self._failing_at_tokens = -1
        self.wake = asyncio.Event()
        self.finished = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._halt = Halt()
        self._force_timer: asyncio.TimerHandle | None = None
        #: where its checkpoint chunks start: each capture adds one for what was generated since the previous
        self.cuts = ChunkCuts.of(staged) if staged is not None else ChunkCuts()
        if staged is not None:
            self.text = staged.text
            self.completion_tokens = staged.completion_tokens
            self.prompt_tokens = staged.prompt_tokens
            if staged.tokens is not None:
                self.prompt_token_ids = _compact(staged.tokens.prompt_token_ids)
                self.generation_token_ids = list(staged.tokens.generation_token_ids)
                self.generation_log_probs = list(staged.tokens.generation_log_probs)
            if staged.complete:
                self.finish_reason = staged.finish_reason

    # --- signals from the manager ----------------------------------------------------

    def request_cut(self, wait_s: float) -> None:
        """Stop the upstream and keep what it sent; close the stream where it is after ``wait_s``."""
        if self.state != GenerationState.RUNNING or self.cut_requested:
            return
        self.cut_requested = True
        self._halt.request()
        self._force_timer = asyncio.get_running_loop().call_later(wait_s, self._force_cut)

    def _force_cut(self) -> None:
        if self._reader is not None and not self._reader.done():
            log.warning(
                "cut waited too long for the upstream to end the stream; closing it where it is",
                extra=self._log_extra(),
            )
            self._reader.cancel()

    def fail(self, error: ApiError) -> None:
        """End the call with ``error`` now (stale attempt, shutdown), whatever it is doing."""
        if self.error is None and self.state != GenerationState.DONE:
            self.error = error
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        self.wake.set()

    # --- the call ----------------------------------------------------------------------

    def tokens(self) -> Tokens | None:
        """The generation's tokens so far (all of them once finished); None while the engine has not reported
        the prompt's ids, or for a response answered from a text-only (schema 1) record."""
        if self.text_only or self.prompt_token_ids is None:
            return None
        return Tokens(self.prompt_token_ids, tuple(self.generation_token_ids), tuple(self.generation_log_probs))

    def prefix(self) -> StagedPrefix:
        """What a checkpoint keeps of this generation, for its attempt; what it wrote since the last call is a chunk
        of its own (``prefixes.ChunkCuts``)."""
        tokens = self.tokens()
        end = (len(tokens.generation_token_ids) if tokens is not None else 0, len(self.text))
        return StagedPrefix(
            attempt=self.identity.attempt if self.identity else 0,
            text=self.text,
            complete=self.finish_reason is not None,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            tokens=tokens,
            chunks=self.cuts.cut(end, tokens is not None),
        )

    async def run(self) -> None:
        """Generate until finished, parking while a checkpoint is open; deliver only when none is."""
        if self.staged is not None:
            self.manager.reused(self.staged.completion_tokens, "staged")
        while self.finish_reason is None:
            await self._park()
            try:
                await self._stream_once()
            except UpstreamUnavailable as exc:
                await self._wait_for_upstream(exc)
        if self.manager.paused:
            self.state = GenerationState.HELD
            self.manager.count_held()
            await self._park()
        self._raise_if_failed()
        self.state = GenerationState.DONE

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    async def _wait_for_upstream(self, exc: UpstreamUnavailable) -> None:
        """Keep what arrived as the prefix and wait before continuing it; fail after the deadline."""
        self.state = GenerationState.CUT
        self.resumes_after = "upstream_failure"
        self.manager.count_upstream_failure()
        retry = self._upstream_retry
        if retry is None:
            config = self.manager.retry
            loop_time = asyncio.get_running_loop().time
            retry = self._upstream_retry = Backoff(config.backoff_s, config.backoff_max_s, config.deadline_s, loop_time)
        elif self.completion_tokens > self._failing_at_tokens:
            retry.reset()  # it made progress since the last failure: new trouble
        self._failing_at_tokens = self.completion_tokens
        if not retry.failed():
            raise ApiError(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"the upstream made no progress for {retry.failing_s:.0f}s (deadline {retry.deadline_s:g}s); "
                f"{self.completion_tokens} tokens are kept for a retry of this request; last error: {exc.message}",
            )
        fleet = self.manager.upstream.fleet
        if fleet.can_fail_over(exc.worker):  # another worker is up: continue the prefix there, now
            fleet.failed_over()
            log.warning(
                "worker failed; continuing the generation on another worker",
                extra={
                    **self._log_extra(),
                    "tokens_kept": self.completion_tokens,
                    "worker": exc.worker,
                    "error": exc.message,
                },
            )
            self._raise_if_failed()
            return
        failing_s = retry.failing_s
        delay = retry.wait_s()
        log.warning(
            "upstream failed; continuing the generation after a backoff",
            extra={
                **self._log_extra(),
                "tokens_kept": self.completion_tokens,
                "retry_in_s": round(delay, 3),
                "failing_s": round(failing_s, 3),
                "error": exc.message,
            },
        )
        self.waiting_for_upstream = True
        try:
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), delay)
        finally:
            self.waiting_for_upstream = False
        self._raise_if_failed()

    async def _park(self) -> None:
        while self.manager.paused and self.error is None:
            self.wake.clear()
            await self.wake.wait()
        self._raise_if_failed()

    async def _request(self) -> tuple[EngineRequest, Tokens | None] | None:
        """The engine request that continues from the tokens kept so far, and those tokens (None for a fresh
        generation); None when the budget is spent."""
        remaining = None
        if self.limit is not None:
            remaining = self.limit - len(self.generation_token_ids)
            if remaining <= 0:
                return None
        prefix = None
        if self.generation_token_ids:
            if self.prompt_token_ids is None:  # the stream was cut before it reported the prompt's ids
                self.prompt_token_ids = _compact(await self.manager.upstream.prompt_token_ids(self.body))
            prefix = self.tokens()
        return self.manager.upstream.engine.request(self.body, prefix, remaining), prefix

    async def _stream_once(self) -> None:
        planned = await self._request()
        if planned is None:
            self.finish_reason = "length"
            return
        request, prefix = planned
        # counted once the upstream answers: a continuation refused by a dead worker reused nothing
        reuse = (
            (self.completion_tokens, self.resumes_after)
            if self.generation_token_ids and self.state == GenerationState.CUT and self.staged is None
            else None
        )
        self.staged = None
        self.state = GenerationState.RUNNING
        self.cut_requested = False
        self._halt = Halt()
        sent_prompt = _compact(prefix.sequence()) if prefix is not None else None
        self._reader = asyncio.create_task(self._read(request, sent_prompt, self.completion_tokens, reuse))
        try:
            await asyncio.wait({self._reader})
        finally:
            if not self._reader.done():  # this call itself was cancelled (shutdown)
                self._reader.cancel()
            if self._force_timer is not None:
                self._force_timer.cancel()
                self._force_timer = None
        self._raise_if_failed()
        if self._reader.cancelled():
            if not self.cut_requested:
                raise ApiError(ErrorCode.INTERNAL, "the upstream stream was cancelled")
        elif (failure := self._reader.exception()) is not None:
            raise failure
        if self.finish_reason is None:
            self.state = GenerationState.CUT
            self.resumes_after = "cut"
            self.manager.count_cut()

    async def _read(
        self, request: EngineRequest, sent_prompt: TokenArray | None, base: int, reuse: tuple[int, str] | None
    ) -> None:
        """Append the stream to ``text`` and the token lists until it ends (after a cut: until the upstream
        stopped). ``sent_prompt``: a continuation's prompt ids (the prefix's sequence)."""
        async with contextlib.aclosing(self.manager.upstream.deltas(request, self._halt, prefix_tokens=base)) as deltas:
            async for delta in deltas:
                if reuse is not None:
                    self.manager.reused(*reuse)
                    reuse = None
                self._apply(delta, sent_prompt)
                if delta.finish_reason is not None:
                    self.finish_reason = self._finish(delta.finish_reason)
                del delta  # not held while the next one is awaited (a first delta holds the prompt's ids)
        if self.finish_reason is None and not self.cut_requested:
            raise UpstreamUnavailable("the upstream stream ended without a finish_reason")

    def _apply(self, delta: Delta, sent_prompt: TokenArray | None) -> None:
        if delta.prompt_token_ids is not None:
            if sent_prompt is not None:  # a continuation: the engine must have used exactly the ids it was sent
                if not sent_prompt == delta.prompt_token_ids:
                    raise ApiError(
                        ErrorCode.UPSTREAM_ERROR, "the upstream continued from other prompt token ids than it was sent"
                    )
            elif self.prompt_token_ids is None:
                self.prompt_token_ids = _compact(delta.prompt_token_ids)
        if self.prompt_token_ids is not None:
            self.prompt_tokens = len(self.prompt_token_ids)
        elif delta.prompt_tokens is not None and self.prompt_tokens is None and sent_prompt is None:
            self.prompt_tokens = delta.prompt_tokens
        self.text += delta.text
        self.generation_token_ids.extend(delta.generation_token_ids)
        self.generation_log_probs.extend(delta.generation_log_probs)
        self.completion_tokens = len(self.generation_token_ids)
        self.manager.generated(len(delta.generation_token_ids))  # counted as it arrives: a capture reads the count
        for call in delta.tool_calls:
            slot = self.structured.setdefault(
                int(call.get("index", len(self.structured))), {"name": "", "arguments": ""}
            )
            function = call.get("function") or {}
            slot["name"] += function.get("name") or ""
            slot["arguments"] += function.get("arguments") or ""

    def _finish(self, reason: str) -> str:
        """Structured tool calls (vLLM with a tool parser) join the text in markup form, once."""
        if self.structured and not tool_markup.parse(self.text).tool_calls:
            self.text += "".join(
                tool_markup.render(c["name"], c["arguments"]) for _, c in sorted(self.structured.items())
            )
        self.structured.clear()
        return reason

    def _log_extra(self) -> dict[str, Any]:
        ident = self.identity
        return {"rollout_id": ident.rollout_id if ident else None, "attempt": ident.attempt if ident else None}


#: bound on kept delivered responses (one per rollout, oldest dropped first)
DELIVERED_KEPT_MAX = 4096


#: how often :meth:`GenerationManager.cut` looks whether every cut generation stopped
CUT_POLL_S = 0.002
#: how long past ``cut_wait_s`` a cut may take (the stream's reader ending) before the capture fails
CUT_MARGIN_S = 1.0


class GenerationManager:
    """Every live generation and staged prefix of one policy model server."""

    def __init__(
        self,
        upstream: Upstream,
        cut_wait_s: float,
        counters: ModelCounters,
        retry: UpstreamRetry | None = None,
        token_information: bool = False,
    ) -> None:
        self.upstream = upstream
        self.cut_wait_s = cut_wait_s
        self.retry = retry or UpstreamRetry()
        #: whether responses carry token information (``return_token_id_information``)
        self.token_information = token_information
        self.paused = False
        self.live: dict[int, Generation] = {}
        #: the call ids in :attr:`live` of each rollout (a rollout's calls found without a walk over every live one)
        self._live_of: dict[str, set[int]] = {}
        self.staged: dict[Key, StagedPrefix] = {}
        #: the last response delivered per rollout, until that rollout calls again: a reply still in
        #: transit when the agent parks is saved too, so the restored attempt need not generate it again
        self.delivered: dict[str, tuple[Key, StagedPrefix]] = {}
        self.totals = {
            "tokens_generated": 0,
            "tokens_reused": 0,
            "responses_held": 0,
            "generations_cut": 0,
            "upstream_failures": 0,
        }
        self.counters = counters
        self._ids = itertools.count()
        #: the tokens received from the upstream (``tokens_generated``) when the last capture took the generations:
        #: every token a checkpoint holds was received by then, and none received later is in it
        self.tokens_at_capture: int | None = None

    # --- accounting ------------------------------------------------------------------

    def generated(self, tokens: int) -> None:
        if tokens > 0:
            self.totals["tokens_generated"] += tokens
            self.counters.tokens_generated.inc(tokens)

    def reused(self, tokens: int, source: str) -> None:
        if tokens > 0:
            self.totals["tokens_reused"] += tokens
            self.counters.tokens_reused.labels(source=source).inc(tokens)

    def count_held(self) -> None:
        self.totals["responses_held"] += 1
        self.counters.responses_held.inc()

    def count_cut(self) -> None:
        self.totals["generations_cut"] += 1
        self.counters.generations_cut.inc()

    def count_upstream_failure(self) -> None:
        self.totals["upstream_failures"] += 1
        self.counters.upstream_failures.inc()

    def live_counts(self) -> dict[str, int]:
        states = [g.state for g in self.live.values()]
        return {
            "generations": states.count(GenerationState.RUNNING),
            "cut": states.count(GenerationState.CUT),
            "held": states.count(GenerationState.HELD),
            "waiting_for_upstream": sum(1 for g in self.live.values() if g.waiting_for_upstream),
            "tokens_in_flight": sum(
                g.completion_tokens for g in self.live.values() if g.state == GenerationState.RUNNING
            ),
            "staged_prefixes": len(self.staged),
            "delivered_kept": len(self.delivered),
            **({} if self.tokens_at_capture is None else {"tokens_generated_at_capture": self.tokens_at_capture}),
            **self.totals,
            **self.upstream.fleet.counts(),
        }

    # --- calls -----------------------------------------------------------------------

    async def generate(
        self, identity: RolloutIdentity | None, digest: str, body: dict[str, Any], limit: int | None
    ) -> Generation:
        """Run one generation to its delivered end; raises ApiError (stale, upstream) otherwise."""
        staged = None
        if identity is not None:
            self._stale_older(identity.rollout_id, identity.attempt)
            key = (identity.rollout_id, digest)
            self.delivered.pop(identity.rollout_id, None)  # the rollout moved on
            found = self.staged.get(key)
            if found is not None and found.attempt <= identity.attempt:
                staged = self.staged.pop(key)
        generation = Generation(self, identity, digest, body, limit, staged)
        call_id = next(self._ids)
        self.live[call_id] = generation
        if identity is not None:
            self._live_of.setdefault(identity.rollout_id, set()).add(call_id)
        try:
            await generation.run()
            if identity is not None and generation.finish_reason is not None:
                self.delivered[identity.rollout_id] = ((identity.rollout_id, digest), generation.prefix())
                while len(self.delivered) > DELIVERED_KEPT_MAX:  # finished rollouts never call again
                    del self.delivered[next(iter(self.delivered))]
            return generation
        except BaseException as exc:
            self._restage_unfinished(generation, exc)
            raise
        finally:
            del self.live[call_id]
            if identity is not None:
                calls = self._live_of[identity.rollout_id]
                calls.discard(call_id)
                if not calls:
                    del self._live_of[identity.rollout_id]
            generation.finished.set()

    def _restage_unfinished(self, generation: Generation, exc: BaseException) -> None:
        """What a failed call reached stays available for a retry of the same request: a restored
        prefix whose call failed (not as stale), and a generation its upstream let down."""
        ident = generation.identity
        if ident is None or generation.error is not None:
            return
        gave_up = (
            isinstance(exc, ApiError)
            and exc.code == ErrorCode.UPSTREAM_UNAVAILABLE
            and bool(generation.generation_token_ids)
        )
        if generation.restored or gave_up:
            self.staged.setdefault((ident.rollout_id, generation.digest), generation.prefix())

    def _stale_older(self, rollout_id: str, attempt: int) -> None:
        """Calls of older attempts of this rollout end with 409 stale_attempt."""
        for call_id in list(self._live_of.get(rollout_id, ())):
            g = self.live[call_id]
            if g.identity is not None and g.identity.attempt < attempt:
                g.fail(_stale(g.identity, f"attempt {attempt} is current"))

    # --- checkpoint ------------------------------------------------------------------

    def hold(self) -> None:
        """Prepare: no stream starts and a finished response is held until resume, while the running streams go on
        generating, through the capture too (:meth:`export` takes each as far as it has streamed); only a final
        checkpoint's capture stops them (:meth:`cut`)."""
        self.paused = True

    async def cut(self) -> None:
        """A final checkpoint's capture: cut every running generation at its next token boundary and wait until each
        has stopped (a cut closes its stream after ``cut_wait_s`` at the latest), so every token the upstream
        generated is in a prefix. A stream that started in between is cut too."""
        deadline = time.monotonic() + self.cut_wait_s + CUT_MARGIN_S
        while running := [g for g in self.live.values() if g.state == GenerationState.RUNNING]:
            if time.monotonic() > deadline:
                raise InvalidState(f"{len(running)} generations did not stop within {self.cut_wait_s:g}s of their cut")
            for g in running:
                g.request_cut(self.cut_wait_s)
            await asyncio.sleep(CUT_POLL_S)

    def resume(self) -> None:
        self.paused = False
        for g in self.live.values():
            g.wake.set()

    def export(self, scope: Scope) -> list[tuple[Key, StagedPrefix]]:
        """One prefix per (rollout, request digest) in scope: running generations as far as they have streamed
        (their streams go on), cut prefixes, held responses, staged prefixes; each immutable, a copy of the token
        lists (the participant writes them after resume)."""
        self.tokens_at_capture = self.totals["tokens_generated"]
        kept: dict[Key, StagedPrefix] = {}
        for g in self.live.values():
            ident = g.identity
            if ident is None or not scope.includes(ident.rollout_id) or not (g.generation_token_ids or g.finish_reason):
                continue
            prefix = g.prefix()
            key = (ident.rollout_id, g.digest)
            if key not in kept or prefix.generated() > kept[key].generated():
                kept[key] = prefix
        for key, staged in self.staged.items():
            if scope.includes(key[0]) and key not in kept:
                kept[key] = staged
        for rollout_id, (key, delivered) in self.delivered.items():
            if scope.includes(rollout_id) and key not in kept:
                kept[key] = delivered
        return sorted(kept.items())

    def release_out_of_scope(self, scope: Scope) -> None:
        for key in [k for k in self.staged if not scope.includes(k[0])]:
            del self.staged[key]
        for rollout_id in [r for r in self.delivered if not scope.includes(r)]:
            del self.delivered[rollout_id]  # the controller no longer runs it: finished

    def validate(self, records: list[RestoredRecord], bases: Bases) -> dict[Key, StagedPrefix]:
        """The prefixes a checkpoint's prefix and prompt records stage (``prefixes.read_records``); installs nothing."""
        return read_records(records, bases)

    def install(self, staged: dict[Key, StagedPrefix]) -> None:
        self.staged.update(staged)
        for (rollout_id, _), prefix in staged.items():
            self._stale_older(rollout_id, prefix.attempt)

    def uninstall(self, staged: dict[Key, StagedPrefix]) -> None:
        for key, prefix in staged.items():
            if self.staged.get(key) is prefix:
                del self.staged[key]

    async def retire(self, rollout_id: str, attempt: int, wait_s: float = 10.0) -> bool:
        """Drop the rollout's prefixes of ``attempt`` and older; end its calls with 409 and wait for them."""
        dropped = [k for k, s in self.staged.items() if k[0] == rollout_id and s.attempt <= attempt]
        for key in dropped:
            del self.staged[key]
        last = self.delivered.get(rollout_id)
        if last is not None and last[1].attempt <= attempt:
            del self.delivered[rollout_id]
        victims = []
        for g in self.live.values():
            if g.identity is not None and g.identity.rollout_id == rollout_id and g.identity.attempt <= attempt:
                g.fail(_stale(g.identity, "the attempt was retired"))
                victims.append(g)
        if victims:
            waiters = [asyncio.create_task(g.finished.wait()) for g in victims]
            _, pending = await asyncio.wait(waiters, timeout=wait_s)
            for waiter in pending:
                waiter.cancel()
        return bool(dropped or victims)

    def shutdown(self) -> None:
        for g in list(self.live.values()):
            g.fail(ApiError(ErrorCode.NOT_READY, "the policy model is shutting down"))


def _compact(ids: Sequence[int]) -> TokenArray:
    """Prompt ids as a compact token array (4 bytes an id)."""
    return ids if isinstance(ids, TokenArray) else TokenArray(token_codec.ids_array(ids))


def _stale(identity: RolloutIdentity, why: str) -> ApiError:
    return ApiError(
        ErrorCode.STALE_ATTEMPT,
        f"rollout {identity.rollout_id!r} attempt {identity.attempt} is stale: {why}",
        details={"rollout_id": identity.rollout_id, "attempt": identity.attempt},
    )
