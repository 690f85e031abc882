"""vLLM's OpenAI-compatible server (and the built-in inference worker, which answers as vLLM does), read as one
SSE stream per generation (:mod:`.sse`): this adapter plans the requests and reads their chunks.

Fields used (vLLM's OpenAI protocol, ``vllm/entrypoints/openai/protocol.py``; ``return_token_ids``
since vLLM 0.10.2):

fresh generation  ``POST /v1/chat/completions`` with ``logprobs: true``, ``top_logprobs: 0``,
                  ``return_tokens_as_token_ids: true`` (each ``logprobs.content[i].token`` is
                  ``"token_id:<id>"``) and ``return_token_ids: true`` (the first chunk carries the
                  prompt's ``prompt_token_ids``, every chunk's choice its ``token_ids``);
continuation      ``POST /v1/completions`` with ``prompt`` = the prompt ids + the prefix ids (a token-id
                  prompt: vLLM neither re-tokenizes nor adds special tokens to it), ``logprobs: 0``
                  (the legacy completions form: ``logprobs.tokens`` / ``logprobs.token_logprobs``),
                  the same two token-id switches, and the chat request's sampling settings.

Why completions for the continuation, not the chat route: vLLM's chat route renders messages
through the chat template and tokenizes text, and stock vLLM has no way to hand it prompt token ids
(NeMo Gym's ``required_prefix_token_ids`` is an extension stock vLLM lacks); the completions route
takes token ids as they are (``docs/decisions.md``). Tool calls: run vLLM *without* a tool-call
parser (the completions route never runs one), so tool calls stay markup in the text on both routes.
"""

from __future__ import annotations

from array import array
from typing import Any, ClassVar

from gym_services.base import token_codec
from gym_services.base.tokens import Tokens
from gym_services.models.policy_model.engines.base import Connection, Delta, EngineProtocolError, EngineRequest
from gym_services.models.policy_model.engines.sse import SseEngine

#: chat request fields that shape sampling and carry over to a completions continuation unchanged
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "logit_bias",
)
TOKEN_PREFIX = "token_id:"


def _token_id(token: Any, where: str) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        raise EngineProtocolError(
            f"{where} is {token!r}, not 'token_id:<id>' (is return_tokens_as_token_ids honoured?)"
        )
    try:
        return int(token[len(TOKEN_PREFIX) :])
    except ValueError:
        raise EngineProtocolError(f"{where} is {token!r}, not 'token_id:<id>'") from None


def _log_prob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineProtocolError(f"{where} is {value!r}, not a number")
    return float(value)


def _ids(value: Any, where: str) -> list[int] | None:
    if value is None:
        return None
    # every element's type at C speed (a first chunk's prompt ids are thousands): ints only, no bool, no float
    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
        raise EngineProtocolError(f"{where} must be a list of integer token ids")
    return value  # the chunk's own list: the chunk is let go once read


def _prompt_ids(value: Any, where: str) -> array[int] | None:
    """A chunk's prompt ids as a compact array (4 bytes an id, not a list of Python ints: the chunk's list goes
    with the chunk)."""
    ids = _ids(value, where)
    if ids is None:
        return None
    try:
        return token_codec.ids_array(ids)
    except ValueError:
        raise EngineProtocolError(f"{where} must be a list of token ids below 2**64, none negative") from None


class VllmEngine(SseEngine):
    name: ClassVar[str] = "vllm"

    def request(self, chat: dict[str, Any], prefix: Tokens | None, max_tokens: int | None) -> EngineRequest:
        token_switches = {"return_tokens_as_token_ids": True, "return_token_ids": True}
        if prefix is None:
            body = {**chat, "logprobs": True, "top_logprobs": 0, **token_switches}
            body.pop("max_completion_tokens", None)
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            return EngineRequest("/chat/completions", body)
        body = {
            "model": chat["model"],
            # a compact array, not a list of Python ints: the request is held for as long as its stream runs, and
            # every continuation after a restore starts at once (:mod:`.sse` writes it as a JSON list)
            "prompt": token_codec.ids_array(prefix.sequence()),
            "logprobs": 0,
            **token_switches,
            **{k: chat[k] for k in SAMPLING_FIELDS if k in chat},
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return EngineRequest("/completions", body)

    def parse_chunk(self, chunk: dict[str, Any]) -> Delta:
        delta = Delta()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            delta.prompt_tokens = usage.get("prompt_tokens")
            delta.completion_tokens = usage.get("completion_tokens")
        delta.prompt_token_ids = _prompt_ids(chunk.get("prompt_token_ids"), "prompt_token_ids")
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if "delta" in choice:  # chat.completion.chunk
                body = choice.get("delta") or {}
                delta.text = body.get("content") or ""
                delta.tool_calls = list(body.get("tool_calls") or [])
                logprob_ids, delta.generation_log_probs = self._chat_logprobs(choice.get("logprobs"))
            else:  # text_completion
                delta.text = choice.get("text") or ""
                logprob_ids, delta.generation_log_probs = self._completion_logprobs(choice.get("logprobs"))
                if delta.prompt_token_ids is None:
                    delta.prompt_token_ids = _prompt_ids(choice.get("prompt_token_ids"), "choices[0].prompt_token_ids")
            token_ids = _ids(choice.get("token_ids"), "choices[0].token_ids")
            if token_ids is not None and token_ids != logprob_ids:
                raise EngineProtocolError(
                    f"choices[0].token_ids {token_ids} disagree with the log-prob tokens {logprob_ids}"
                )
            delta.generation_token_ids = logprob_ids
            delta.finish_reason = choice.get("finish_reason")
        if delta.text and not delta.generation_token_ids:
            raise EngineProtocolError("a chunk carries text but no token ids with log-probs (is logprobs honoured?)")
        return delta

    @staticmethod
    def _chat_logprobs(block: Any) -> tuple[list[int], list[float]]:
        if block is None:
            return [], []
        content = block.get("content") if isinstance(block, dict) else None
        if not isinstance(content, list):
            raise EngineProtocolError(f"choices[0].logprobs is {block!r}, not {{'content': [...]}}")
        ids, probs = [], []
        for i, entry in enumerate(content):
            if not isinstance(entry, dict):
                raise EngineProtocolError(f"choices[0].logprobs.content[{i}] is not an object")
            ids.append(_token_id(entry.get("token"), f"choices[0].logprobs.content[{i}].token"))
            probs.append(_log_prob(entry.get("logprob"), f"choices[0].logprobs.content[{i}].logprob"))
        return ids, probs

    @staticmethod
    def _completion_logprobs(block: Any) -> tuple[list[int], list[float]]:
        if block is None:
            return [], []
        tokens = block.get("tokens") if isinstance(block, dict) else None
        values = block.get("token_logprobs") if isinstance(block, dict) else None
        if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
            raise EngineProtocolError(
                f"choices[0].logprobs is {block!r}, not {{'tokens': [...], 'token_logprobs': [...]}}"
            )
        ids = [_token_id(t, f"choices[0].logprobs.tokens[{i}]") for i, t in enumerate(tokens)]
        probs = [_log_prob(v, f"choices[0].logprobs.token_logprobs[{i}]") for i, v in enumerate(values)]
        return ids, probs

    async def prompt_token_ids(self, connection: Connection, chat: dict[str, Any]) -> list[int]:
        """vLLM's ``POST /tokenize`` (at the server root) with the chat request's prompt fields."""
        body = {k: chat[k] for k in ("model", "messages", "tools") if k in chat}
        url = f"{connection.root}/tokenize"
        response = await connection.client.post(url, json={**body, "add_generation_prompt": True})
        if response.status_code != 200:
            raise EngineProtocolError(f"{url} answered {response.status_code}: {response.text[:300]}")
        tokens = _ids(response.json().get("tokens"), "tokenize.tokens")
        if tokens is None:
            raise EngineProtocolError(f"{url} answered no tokens")
        return tokens
