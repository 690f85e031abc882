"""llama.cpp's ``llama-server``: one token per request, so that no id, log-prob or seed is lost.

Why not one stream per generation, as with vLLM: llama-server (checked on its sources of the build the
``engine`` extra pins) withholds a token whose text ends inside a multi-byte UTF-8 character. Its bytes
are merged into the next streamed entry and its id is in no streamed chunk (``/completion`` or
``/v1/completions``), its log-prob in no answer at all; and a request's seeded sampler starts from the
seed, so a continuation after a cut could not draw what the uninterrupted stream would have.

So this adapter's :meth:`~LlamaCppEngine.deltas` drives the exchange itself, each step one native ``POST
/completion`` for one token:

- ``prompt``: the token ids (the chat prompt's, then every generated id): llama-server neither
  re-tokenizes nor adds special tokens to an id prompt, and ``cache_prompt`` reuses the slot's KV
  cache, so a step evaluates only the newest token;
- ``return_tokens: true`` gives the sampled id even when its text is incomplete; ``n_probs: 1`` with
  ``post_sampling_probs: false`` gives its log-prob from the model's softmax (vLLM's raw log-probs).
  When llama-server withheld the log-prob (incomplete text), one scoring request at the same position
  (greedy, the next token forced to a plain one by ``logit_bias``, ``n_probs`` = the vocabulary) reads
  it from the whole distribution;
- ``seed``: when the chat request has one, step ``k`` is seeded with a hash of (seed, k): the draw at
  position ``k`` depends on the seed, the position and the ids before it only, so a continuation from
  any cut draws exactly what the uninterrupted generation drew;
- sampling is the OpenAI semantics: ``temperature`` (1 unless given), ``top_p`` (1 unless given),
  llama.cpp's own extra samplers off (top-k, min-p, typical, penalties, DRY, XTC).

The chat prompt's ids come from ``/apply-template`` (the model's chat template) and ``/tokenize``
(special tokens parsed, none added). The text of each token is its bytes (read once per worker from
a full distribution, which names every id's bytes) decoded incrementally across the generation and
its continuations, so a character split over tokens appears whole with the token completing it.

A cut (``halt``) ends the generation after the step in flight: nothing generated is dropped. A worker
killed mid-generation fails the step in flight; the policy model continues from the ids it has.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import httpx

from gym_services.base.tokens import Tokens
from gym_services.models.policy_model.engines.base import (
    TRANSIENT_STATUS,
    Connection,
    Delta,
    Engine,
    EngineError,
    EngineProtocolError,
    EngineRequest,
    EngineUnavailable,
    Halt,
)

#: llama.cpp's own samplers, off: what is left is the OpenAI semantics (temperature, top_p)
NEUTRAL_SAMPLING = {
    "top_k": 0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
}
#: chat fields that name the prompt (the rest of the chat body is sampling settings or ignored)
PROMPT_FIELDS = ("messages", "tools", "tool_choice", "chat_template_kwargs")
#: chat fields that shape sampling (:meth:`LlamaCppEngine.sampling` maps them)
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
#: llama.cpp's "pick a random seed" value: never sent as a derived seed
RANDOM_SEED = 0xFFFFFFFF


def step_seed(seed: int, position: int) -> int:
    """The seed of the draw at ``position`` (0 = the first generated token) of a generation seeded ``seed``."""
    digest = hashlib.sha256(f"{seed}:{position}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % RANDOM_SEED


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise EngineProtocolError(f"{where} must be a list of integer token ids, not {str(value)[:200]}")
    return list(value)


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(url, json=body)
    if response.status_code != 200:
        message = f"{url} answered {response.status_code}: {response.text[:300]}"
        if response.status_code in TRANSIENT_STATUS:
            raise EngineUnavailable(message, response.status_code)
        raise EngineError(message, response.status_code)
    answer = response.json()
    if not isinstance(answer, dict):
        raise EngineProtocolError(f"{url} answered {str(answer)[:200]}, not an object")
    return answer


class LlamaCppEngine(Engine):
    name: ClassVar[str] = "llama.cpp"

    def __init__(self) -> None:
        #: per worker root URL: every token id's bytes (the tokenizer's pieces, special tokens as b"")
        self._pieces: dict[str, list[bytes]] = {}
        #: per worker root URL: a token whose text is complete on its own
        self._plain: dict[str, int] = {}

    # --- the interface -------------------------------------------------------------------

    def request(self, chat: dict[str, Any], prefix: Tokens | None, max_tokens: int | None) -> EngineRequest:
        """The generation to drive: a fresh one carries the chat prompt fields, a continuation its token
        ids as ``prompt`` (the chat prompt's ids + the prefix ids); both the sampling settings."""
        if max_tokens is None:
            max_tokens = chat.get("max_tokens") or chat.get("max_completion_tokens")
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "sampling": {k: chat[k] for k in SAMPLING_FIELDS if k in chat},
        }
        if prefix is None:
            body.update({k: chat[k] for k in PROMPT_FIELDS if k in chat})
            body["generated"] = 0
        else:
            body["prompt"] = list(prefix.sequence())
            body["generated"] = len(prefix.generation_token_ids)
            body["prefix_token_ids"] = list(prefix.generation_token_ids)
        return EngineRequest("//completion", body)

    @staticmethod
    def sampling(chat: dict[str, Any]) -> dict[str, Any]:
        """The chat request's sampling settings in llama.cpp's terms (the step seed is added per step)."""
        settings: dict[str, Any] = {
            **NEUTRAL_SAMPLING,
            "temperature": float(chat["temperature"]) if chat.get("temperature") is not None else 1.0,
            "top_p": float(chat["top_p"]) if chat.get("top_p") is not None else 1.0,
            "presence_penalty": float(chat.get("presence_penalty") or 0.0),
            "frequency_penalty": float(chat.get("frequency_penalty") or 0.0),
        }
        if chat.get("seed") is not None:
            settings["seed"] = int(chat["seed"])
        return settings

    def read_step(self, answer: dict[str, Any]) -> Delta:
        """One step's answer: its one token id, and its log-prob when llama-server reported it (a token
        whose text is incomplete has none: :meth:`deltas` reads it from the distribution instead)."""
        tokens = _ids(answer.get("tokens"), "tokens")
        if len(tokens) != 1:
            raise EngineProtocolError(f"a one-token step answered {len(tokens)} token ids (is return_tokens honoured?)")
        delta = Delta(generation_token_ids=tokens)
        for entry in answer.get("completion_probabilities") or []:
            if (
                isinstance(entry, dict)
                and entry.get("id") == tokens[0]
                and isinstance(entry.get("logprob"), (int, float))
            ):
                delta.generation_log_probs = [float(entry["logprob"])]
        if answer.get("stop_type") == "eos":
            delta.finish_reason = "stop"
        elif answer.get("truncated"):
            delta.finish_reason = "length"  # the slot's context is full
        return delta

    async def prompt_token_ids(self, connection: Connection, chat: dict[str, Any]) -> list[int]:
        """The chat prompt through the model's chat template (``/apply-template``), then ``/tokenize``."""
        client, root = connection.client, connection.root
        body = {k: chat[k] for k in PROMPT_FIELDS if k in chat}
        templated = await _post(client, f"{root}/apply-template", {**body, "add_generation_prompt": True})
        if not isinstance(templated.get("prompt"), str):
            raise EngineProtocolError(f"{root}/apply-template answered no prompt: {str(templated)[:200]}")
        tokenized = await _post(
            client, f"{root}/tokenize", {"content": templated["prompt"], "add_special": False, "parse_special": True}
        )
        return _ids(tokenized.get("tokens"), "tokenize.tokens")

    async def deltas(self, connection: Connection, request: EngineRequest, halt: Halt) -> AsyncGenerator[Delta]:
        """One ``/completion`` step per token until a finish reason, the budget, or a cut (checked between
        steps, so the step in flight is always delivered)."""
        client, root, body = connection.client, connection.root, request.body
        pieces = await self.pieces(client, root)
        if "prompt" in body:
            context = _ids(body["prompt"], "prompt")
        else:
            context = await self.prompt_token_ids(connection, body)
        reported: list[int] | None = list(context)
        # the text so far ends where the prefix's bytes end: a character the prefix split is completed by the next token
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for token in body.get("prefix_token_ids") or ():
            decoder.decode(self._piece(pieces, token))
        # the upstream's extra_body first, the request's own settings over it (as an SSE engine's payload)
        sampling = self.sampling({**connection.extra_body, **body["sampling"]})
        seed = sampling.pop("seed", None)
        generated, budget = int(body.get("generated") or 0), body.get("max_tokens")
        prompt_tokens = len(context)
        produced = 0
        while budget is None or produced < budget:
            if halt.requested:
                return  # a cut: at a token boundary, nothing in flight
            drawn_with = None if seed is None else step_seed(seed, generated + produced)
            delta = await self._step(client, root, context, sampling, drawn_with, pieces)
            token = delta.generation_token_ids[0]
            produced += 1
            context = [*context, token]
            if delta.finish_reason is None and budget is not None and produced >= budget:
                delta.finish_reason = "length"
            delta.text = decoder.decode(self._piece(pieces, token), final=delta.finish_reason is not None)
            delta.prompt_tokens, delta.prompt_token_ids, reported = prompt_tokens, reported, None
            yield delta
            if delta.finish_reason is not None:
                return
        # a zero budget: nothing to generate
        yield Delta(finish_reason="length", prompt_token_ids=reported, prompt_tokens=prompt_tokens)

    async def _step(
        self,
        client: httpx.AsyncClient,
        root: str,
        context: list[int],
        sampling: dict[str, Any],
        seed: int | None,
        pieces: list[bytes],
    ) -> Delta:
        """The next token after ``context``, with its log-prob (from the distribution when llama-server withheld it)."""
        step = {
            "prompt": context,
            "n_predict": 1,
            "return_tokens": True,
            "n_probs": 1,
            "post_sampling_probs": False,
            "cache_prompt": True,
            "stream": False,
            **sampling,
        }
        if seed is not None:
            step["seed"] = seed
        delta = self.read_step(await _post(client, f"{root}/completion", step))
        if not delta.generation_log_probs:
            token = delta.generation_token_ids[0]
            delta.generation_log_probs = [await self._log_prob(client, root, context, token, pieces)]
        return delta

    # --- vocabulary and log-probs -----------------------------------------------------------

    @staticmethod
    def _piece(pieces: list[bytes], token: int) -> bytes:
        if not 0 <= token < len(pieces):
            raise EngineProtocolError(f"token id {token} is outside the vocabulary ({len(pieces)} ids)")
        return pieces[token]

    async def pieces(self, client: httpx.AsyncClient, root: str) -> list[bytes]:
        """Every id's bytes on the worker at ``root`` (asked once: one full distribution names them all)."""
        known = self._pieces.get(root)
        if known is not None:
            return known
        models = await client.get(f"{root}/v1/models")
        if models.status_code != 200:
            raise EngineUnavailable(f"{root}/v1/models answered {models.status_code}", models.status_code)
        try:
            n_vocab = int(models.json()["data"][0]["meta"]["n_vocab"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineProtocolError(f"{root}/v1/models names no n_vocab: {models.text[:200]}") from None
        plain = await self._plain_token(client, root)
        distribution = await self._distribution(client, root, [plain], n_vocab, plain)
        pieces: list[bytes | None] = [None] * n_vocab
        for entry in distribution:
            pieces[entry["id"]] = bytes(entry.get("bytes") or b"")
        named = [p for p in pieces if p is not None]
        if len(named) != n_vocab:
            raise EngineProtocolError(f"{root}: the full distribution does not name all {n_vocab} token ids")
        self._pieces[root] = named
        return self._pieces[root]

    async def _plain_token(self, client: httpx.AsyncClient, root: str) -> int:
        """A token whose text is complete on its own (forced in scoring requests, so llama-server reports probs)."""
        if root not in self._plain:
            answer = await _post(client, f"{root}/tokenize", {"content": "a", "add_special": False})
            tokens = _ids(answer.get("tokens"), "tokenize.tokens")
            if len(tokens) != 1:
                raise EngineProtocolError(f"{root}: 'a' tokenizes to {tokens}, not one token")
            self._plain[root] = tokens[0]
        return self._plain[root]

    @staticmethod
    async def _distribution(
        client: httpx.AsyncClient, root: str, context: list[int], n_probs: int, forced: int
    ) -> list[dict[str, Any]]:
        """The model's whole next-token distribution after ``context`` (log-probs before sampling)."""
        answer = await _post(
            client,
            f"{root}/completion",
            {
                "prompt": context,
                "n_predict": 1,
                "n_probs": n_probs,
                "post_sampling_probs": False,
                "cache_prompt": True,
                "temperature": 0,
                "logit_bias": [[forced, 1e6]],
                "return_tokens": True,
                "stream": False,
            },
        )
        entries = answer.get("completion_probabilities") or []
        if len(entries) != 1 or not isinstance(entries[0].get("top_logprobs"), list):
            raise EngineProtocolError(f"{root}: a scoring request answered no distribution: {str(answer)[:200]}")
        distribution: list[dict[str, Any]] = entries[0]["top_logprobs"]
        return distribution

    async def _log_prob(
        self, client: httpx.AsyncClient, root: str, context: list[int], token: int, pieces: list[bytes]
    ) -> float:
        """The log-prob of ``token`` after ``context``, read from the whole distribution."""
        plain = await self._plain_token(client, root)
        for entry in await self._distribution(client, root, context, len(pieces), plain):
            if entry.get("id") == token:
                return float(entry["logprob"])
        raise EngineProtocolError(f"{root}: token {token} is not in the distribution after {len(context)} tokens")
