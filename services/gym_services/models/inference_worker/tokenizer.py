"""The built-in worker's tokenizer: byte-level, with sub-word tokens and a ChatML-style template.

Text is split into pieces (a word with one leading space, one punctuation character, a whitespace
run), and each piece's UTF-8 bytes into tokens of at most :data:`CHUNK` bytes. So, as with a real BPE
tokenizer,

- a long word is several tokens, and a token can end inside a multi-byte character (``"é"`` split
  across two tokens), so a generation cut at a token boundary can be cut inside a word or a character;
- tokenizing text again is not the same as the tokens generated: where a word is split depends on
  the whole word, so the tokens of a cut prefix's text are in general not the tokens generated
  before the cut, which is why a cut generation is continued from its token ids, never from its text.

Token ids: :data:`SPECIAL` ids first (``<|im_start|>``, ``<|im_end|>``), then every byte string of
length 1 to :data:`CHUNK` by length and value; so every id decodes to its bytes without a vocabulary
file, and every byte string has exactly one id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_PIECE = re.compile(r" ?\w+| ?[^\w\s]|\s+")

#: the longest token, in bytes
CHUNK = 3
IM_START = 1
IM_END = 2
#: the end-of-sequence token a natural stop generates
EOS = IM_END
SPECIAL = {0: "<|pad|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
_FIRST = 16  # ids below are reserved for special tokens
_OFFSETS = [_FIRST]
for _length in range(1, CHUNK + 1):
    _OFFSETS.append(_OFFSETS[-1] + 256**_length)
#: ids are 0 .. VOCAB_SIZE - 1
VOCAB_SIZE = _OFFSETS[-1]


def pieces(text: str) -> list[str]:
    """The pretokenized pieces of ``text``; joined they give ``text`` back."""
    return _PIECE.findall(text)


def _chunk_id(chunk: bytes) -> int:
    return _OFFSETS[len(chunk) - 1] + int.from_bytes(chunk, "big")


def encode_bytes(data: bytes) -> list[int]:
    """Token ids of raw bytes (a piece, or the rest of one), in chunks of at most CHUNK bytes.

    Where a piece longer than CHUNK is split depends on the whole piece (a hash of it draws the chunk
    sizes), as a BPE tokenizer's merges depend on what follows: so the tokens of a word's beginning are
    in general not the first tokens of the word."""
    if len(data) <= CHUNK:
        return [_chunk_id(data)] if data else []
    draws = hashlib.blake2b(data, digest_size=64).digest()
    ids: list[int] = []
    at = 0
    step = 0
    while at < len(data):
        draw = draws[step % len(draws)]
        step += 1
        size = 3 if draw < 128 else 2 if draw < 205 else 1
        ids.append(_chunk_id(data[at : at + min(size, CHUNK)]))
        at += min(size, CHUNK)
    return ids


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (never special ids)."""
    ids: list[int] = []
    for piece in pieces(text):
        ids.extend(encode_bytes(piece.encode()))
    return ids


def token_bytes(token: int) -> bytes:
    """The bytes one id stands for (special tokens: their name)."""
    if token in SPECIAL:
        return SPECIAL[token].encode()
    if not _FIRST <= token < VOCAB_SIZE:
        raise ValueError(f"token id {token} is out of range (vocabulary 0..{VOCAB_SIZE - 1})")
    for length in range(1, CHUNK + 1):
        if token < _OFFSETS[length]:
            return (token - _OFFSETS[length - 1]).to_bytes(length, "big")
    raise AssertionError("unreachable")


def decode_bytes(tokens: Iterable[int]) -> bytes:
    return b"".join(token_bytes(t) for t in tokens)


def decode(tokens: Iterable[int]) -> str:
    return decode_bytes(tokens).decode("utf-8", "replace")


def encode_rest(text: str, offset: int) -> list[int]:
    """Token ids of ``text``'s UTF-8 bytes from byte ``offset`` on, tokenized as a continuation of a
    prefix that ended there would be tokenized from text: the rest of the piece the offset falls in,
    then the following pieces."""
    ids: list[int] = []
    start = 0
    for piece in pieces(text):
        data = piece.encode()
        end = start + len(data)
        if end > offset:
            ids.extend(encode_bytes(data[max(0, offset - start) :]))
        start = end
    return ids


def count_tokens(text: str) -> int:
    return len(encode(text))


# --- the chat template --------------------------------------------------------------------


def tool_names(tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    names = []
    for tool in tools or []:
        inner = tool.get("function")
        function = inner if isinstance(inner, dict) else tool
        if isinstance(function.get("name"), str):
            names.append(function["name"])
    return tuple(names)


def render_chat(
    turns: Sequence[tuple[str, str]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool = True
) -> list[int]:
    """The prompt's token ids: ``<|im_start|>role\\ntext<|im_end|>\\n`` per message (the tools first,
    as a ``tools`` message of their JSON), then ``<|im_start|>assistant\\n`` for the answer."""
    ids: list[int] = []
    blocks = ([("tools", json.dumps(tools, sort_keys=True, ensure_ascii=False))] if tools else []) + list(turns)
    for role, text in blocks:
        ids += _block(f"{role}\n{text}")
    if add_generation_prompt:
        ids += [IM_START, *encode("assistant\n")]
    return ids


@lru_cache(maxsize=4096)
def _block(text: str) -> tuple[int, ...]:
    """One message of the template. Kept for the next prompts: every call of a rollout renders the messages before
    it again, and the rollouts of a task share their tools and system prompt (the same ids, not tokenized again)."""
    return (IM_START, *encode(text), IM_END, *encode("\n"))


@dataclass(frozen=True)
class ParsedPrompt:
    """A prompt read back: its messages, its tools, and the assistant turn it leaves open (the ids
    generated so far when it is a continuation)."""

    turns: list[tuple[str, str]]
    tools: list[dict[str, Any]] | None
    answer_ids: list[int]


_HEADER = encode("assistant\n")


def parse_prompt(ids: list[int]) -> ParsedPrompt:
    """Invert :func:`render_chat` (+ the answer's ids so far); ValueError when ``ids`` is not such a prompt."""
    turns: list[tuple[str, str]] = []
    tools = None
    i = 0
    n = len(ids)
    while i < n:
        if ids[i] != IM_START:
            raise ValueError(f"token {i} is {ids[i]}, not <|im_start|>")
        try:
            end = ids.index(IM_END, i + 1)
        except ValueError:
            break  # the open assistant turn
        role, sep, text = decode_bytes(ids[i + 1 : end]).decode("utf-8", "replace").partition("\n")
        if not sep:
            raise ValueError(f"message at token {i} has no role line")
        if role == "tools":
            tools = json.loads(text)
        else:
            turns.append((role, text))
        i = end + 1
        if ids[i : i + 1] != encode("\n"):
            raise ValueError(f"token {i} is not the newline after <|im_end|>")
        i += 1
    if i >= n or ids[i + 1 : i + 1 + len(_HEADER)] != _HEADER:
        raise ValueError("the prompt does not end in an open assistant turn (<|im_start|>assistant\\n ...)")
    return ParsedPrompt(turns, tools, ids[i + 1 + len(_HEADER) :])
