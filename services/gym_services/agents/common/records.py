"""An episode in a checkpoint: a small head and append-only chunks (``docs/protocol.md``, "The episode record").

An episode's boundary grows step by step and mostly repeats itself: the task row, every output item so far, the
tool schemas echoed in each response, each call's tokens. Its checkpoint records are a log in which each value is
written once:

- a **chunk** (``episode-<rollout>=c<n>``, binary, zlib-compressed) holds the values first seen since the previous
  chunk: the JSON
  text of every object or array of at least :data:`VALUE_MIN` bytes, in which the values written before (in this
  chunk or an earlier one) are references (``{"$v": id}``) and each call's token fields are a reference to its
  triple (``{"$t": id}``); the triples first seen: a call the policy model recorded in its token ledger by the
  ledger's call id (its tokens are not written again), any other call's tokens in binary (4 bytes per id and per
  log-prob, each written against the previous such call's, :mod:`gym_services.base.token_codec`); and the
  boundary itself (a reference, mostly). A chunk once written never changes: the next checkpoint references it in
  the earlier checkpoint's packs, so an episode that took one step writes that step;
- the **head** (``episode-<rollout>``, JSON) names the agent, the rollout, the attempt and how many chunks there are.

An episode that has written :data:`MAX_CHUNKS` chunks writes its next one whole (every value and triple again),
and its earlier ones are left behind: the chunks an episode costs stay a few, at the price of one rewrite in
:data:`MAX_CHUNKS` checkpoints.

The capture only takes references (a boundary is never changed once made, its token arrays are immutable, the
chunks are bytes); :class:`EpisodeEncoder` makes the new chunk after resume and keeps it for the next checkpoints
(:meth:`EpisodeEncoder.encoded`). Schema 1 records (one JSON record, the boundary whole) are still read.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.tokens import EpisodeTokens, Pending, is_triple
from gym_services.base import token_codec
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import FIELDS

EPISODE_SCHEMA_VERSION = 2
EPISODE_KIND: Final = "gym-checkpoint/agent-episode"
#: the first byte of a chunk (its layout's version); the rest is zlib-compressed (the values are JSON text, and an
#: episode's text repeats itself: tool schemas in the row, the request and every response's echo)
CHUNK_LAYOUT = 1
#: zlib's level: its fastest (text still shrinks 4-5 times)
COMPRESSION = 1
#: objects and arrays whose JSON is shorter are written inline wherever they occur
VALUE_MIN = 64
#: an episode with this many chunks writes its next one whole
MAX_CHUNKS = 32
_LEDGER, _OWN = 0, 1
_MARKERS = frozenset({"$v", "$t", "$d"})


class EpisodeHead(BaseModel):
    """An episode's head record (schema 2): its boundary is the last of its ``chunks`` chunks."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2]
    kind: Literal["gym-checkpoint/agent-episode"] = EPISODE_KIND
    agent: str
    rollout_id: str
    attempt: int = Field(ge=0)
    chunks: int = Field(ge=1)


@dataclass
class EpisodeLog:
    """What an episode's checkpoints hold of it so far: its chunks, the boundary the last one ends with, and how
    many values and triples they define. Changed only by :meth:`EpisodeEncoder.encoded` (after a chunk is made)
    and by a restore."""

    chunks: list[bytes] = field(default_factory=list)
    boundary: Boundary | None = None
    values: int = 0
    triples: int = 0


@dataclass(frozen=True)
class FrozenChunk:
    """A chunk to write: already made (``data``); or to make from ``boundary`` after the chunks ``earlier`` (the
    episode's token table up to ``triples`` triples), kept in ``log`` once made; or, for a finished episode, made
    whole from what it kept (``finished`` gives its boundary's values when the chunk is made; a ``boundary_model``)."""

    log: EpisodeLog
    data: bytes | None = None
    earlier: tuple[bytes, ...] = ()
    boundary: Boundary | None = None
    tokens: EpisodeTokens | None = None
    triples: int = 0
    finished: Callable[[], dict[str, Any]] | None = None
    boundary_model: type[Boundary] | None = None


@dataclass(frozen=True)
class FrozenHead:
    head: dict[str, Any]


FrozenEpisode = FrozenChunk | FrozenHead


def episode_chunk_key(head_key: str, index: int) -> str:
    """A chunk's key: its head's and ``=c<index>`` (``=`` is in no rollout id, so in no head's key)."""
    return f"{head_key}=c{index}"


# --- the chunk layout -------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:16]


@dataclass
class _Chunk:
    """A chunk's parts: ``values`` are defined from id ``value_base`` on, ``triples`` from ``triple_base`` on (a
    ledger call id, or own tokens as written); ``root`` is the boundary's JSON text."""

    value_base: int
    triple_base: int
    values: list[str]
    triples: list[tuple[int, bytes]]
    root: str

    def encode(self) -> bytes:
        out = bytearray()
        for number in (self.value_base, self.triple_base, len(self.values)):
            token_codec.write_varint(number, out)
        for text in self.values:
            data = text.encode()
            token_codec.write_varint(len(data), out)
            out += data
        token_codec.write_varint(len(self.triples), out)
        for kind, data in self.triples:
            out.append(kind)
            if kind == _LEDGER:
                token_codec.write_varint(len(data), out)
            out += data
        root = self.root.encode()
        token_codec.write_varint(len(root), out)
        out += root
        return bytes((CHUNK_LAYOUT,)) + zlib.compress(out, COMPRESSION)

    @classmethod
    def decode(cls, data: bytes) -> _Chunk:
        if not data or data[0] != CHUNK_LAYOUT:
            raise token_codec.TokenCodecError("not an episode chunk")
        view = memoryview(payload(data))
        value_base, offset = token_codec.read_varint(view, 0)
        triple_base, offset = token_codec.read_varint(view, offset)
        count, offset = token_codec.read_varint(view, offset)
        values = []
        for _ in range(count):
            size, offset = token_codec.read_varint(view, offset)
            values.append(_text(view, offset, size))
            offset += size
        count, offset = token_codec.read_varint(view, offset)
        triples: list[tuple[int, bytes]] = []
        for _ in range(count):
            if offset >= len(view):
                raise token_codec.TokenCodecError("truncated triple")
            kind = view[offset]
            if kind == _LEDGER:
                size, start = token_codec.read_varint(view, offset + 1)
                triples.append((kind, bytes(view[start : start + size])))
                offset = start + size
            elif kind == _OWN:
                _, end = token_codec.decode(view, offset + 1)
                triples.append((kind, bytes(view[offset + 1 : end])))
                offset = end
            else:
                raise token_codec.TokenCodecError(f"unknown triple kind {kind}")
        size, offset = token_codec.read_varint(view, offset)
        root = _text(view, offset, size)
        if offset + size != len(view):
            raise token_codec.TokenCodecError("bytes after the chunk's root")
        return cls(value_base, triple_base, values, triples, root)


def payload(data: bytes) -> bytes:
    """A chunk's layout, uncompressed."""
    inflate = zlib.decompressobj()
    try:
        body = inflate.decompress(data[1:])
    except zlib.error as exc:
        raise token_codec.TokenCodecError(f"not an episode chunk: {exc}") from None
    if not inflate.eof or inflate.unused_data:
        raise token_codec.TokenCodecError("not an episode chunk: its compressed body is cut short or followed by more")
    return body


def _text(view: memoryview, offset: int, size: int) -> str:
    if offset + size > len(view):
        raise token_codec.TokenCodecError("truncated value")
    return bytes(view[offset : offset + size]).decode()


# --- encoding ---------------------------------------------------------------------------


class _Writer:
    """Writes a boundary as values, each new one once, against the values and triples of the earlier chunks."""

    def __init__(self, earlier: tuple[bytes, ...], tokens: EpisodeTokens, triples: int, whole: bool) -> None:
        self.tokens = tokens
        self.index: dict[bytes, int] = {}
        self.values: list[str] = []
        self.base = 0
        self.triple_base = 0
        if not whole:
            for data in earlier:
                chunk = _Chunk.decode(data)
                for i, text in enumerate(chunk.values):
                    self.index[_digest(text)] = chunk.value_base + i
                self.base = chunk.value_base + len(chunk.values)
                self.triple_base = chunk.triple_base + len(chunk.triples)
        self.triple_end = triples

    def value(self, value: Any) -> str:
        if isinstance(value, dict):
            text = self._object(value)
        elif isinstance(value, (list, tuple)):
            text = "[" + ",".join(self.value(v) for v in value) + "]"
        elif isinstance(value, (TokenArray, Pending)):
            raise ValueError("token arrays outside a call's token fields")
        else:
            return json.dumps(value, ensure_ascii=False)
        if len(text) < VALUE_MIN:
            return text
        key = _digest(text)
        known = self.index.get(key)
        if known is None:
            known = self.index[key] = self.base + len(self.values)
            self.values.append(text)
        return f'{{"$v":{known}}}'

    def _object(self, value: dict[str, Any]) -> str:
        triple = self._triple(value) if is_triple(value) else None
        pairs = [
            (
                json.dumps(key, ensure_ascii=False),
                f'{{"$t":{triple}}}' if triple is not None and key in FIELDS else None,
            )
            for key in value
        ]
        texts = [
            text if text is not None else self.value(item)
            for (_, text), item in zip(pairs, value.values(), strict=True)
        ]
        if len(value) == 1 and next(iter(value)) in _MARKERS:  # a value that would read as a reference: escaped
            return f'{{"$d":[[{pairs[0][0]},{texts[0]}]]}}'
        return "{" + ",".join(f"{key}:{text}" for (key, _), text in zip(pairs, texts, strict=True)) + "}"

    def _triple(self, value: dict[str, Any]) -> int | None:
        prompt = value.get("prompt_token_ids")
        if isinstance(prompt, Pending):
            return prompt.index
        if not isinstance(prompt, TokenArray):
            return None
        index = self.tokens.index_of(prompt)
        if index is None or index >= self.triple_end:
            raise ValueError("a call's token arrays that are not the episode's")
        return index

    def triples(self) -> list[tuple[int, bytes]]:
        """The triples from the first not yet written to the last the boundary's table held at the capture."""
        out: list[tuple[int, bytes]] = []
        base = self._own_base()
        for index in range(self.triple_base, self.triple_end):
            triple = self.tokens.triples[index]
            call = self.tokens.pending.get(index) if triple is None else triple.call
            if call is not None:
                out.append((_LEDGER, call.encode()))
                continue
            assert triple is not None
            tokens = triple.tokens()
            out.append((_OWN, bytes(token_codec.encode(tokens, base))))
            base = tokens.sequence()
        return out

    def _own_base(self) -> tuple[int, ...]:
        """The sequence of the last triple written with its own tokens before this chunk's first."""
        for index in range(self.triple_base - 1, -1, -1):
            triple = self.tokens.triples[index]
            if triple is not None and triple.call is None:
                return triple.tokens().sequence()
        return ()


def encode_chunk(state: FrozenChunk) -> bytes:
    """The chunk a capture asked for: as held, or made from the boundary (whole, past :data:`MAX_CHUNKS`)."""
    if state.data is not None:
        return state.data
    if state.finished is not None:
        assert state.boundary_model is not None
        tokens = EpisodeTokens()
        kept = state.boundary_model.model_validate(state.finished()).model_dump()
        tokens.intern(kept)  # its token arrays made this chunk's table's
        writer = _Writer((), tokens, len(tokens), True)
        root = writer.value(kept)
        return _Chunk(0, 0, writer.values, writer.triples(), root).encode()
    assert state.boundary is not None and state.tokens is not None
    writer = _Writer(state.earlier, state.tokens, state.triples, not state.earlier)
    root = writer.value(state.boundary.model_dump())
    return _Chunk(writer.base, writer.triple_base, writer.values, writer.triples(), root).encode()


class EpisodeEncoder:
    """The agent participant's :class:`~gym_services.control.participant.RecordEncoder`: a head's JSON, a chunk as
    held, or a new chunk; a new chunk is kept in its episode's log once made, for the next checkpoints."""

    def encode(self, state: FrozenEpisode) -> bytes:
        if isinstance(state, FrozenHead):
            return json.dumps(state.head, ensure_ascii=False, separators=(",", ":")).encode()
        return encode_chunk(state)

    def encoded(self, state: FrozenEpisode, data: bytes) -> None:
        if not isinstance(state, FrozenChunk) or state.data is not None or state.finished is not None:
            return
        log = state.log
        chunk = _Chunk.decode(data)
        if len(log.chunks) < len(state.earlier) or any(
            a is not b for a, b in zip(log.chunks, state.earlier, strict=False)
        ):
            return  # the episode's log moved on meanwhile (it cannot: one upload at a time); keep what it holds
        log.chunks = [*state.earlier, data]
        log.boundary = state.boundary
        log.values = chunk.value_base + len(chunk.values)
        log.triples = chunk.triple_base + len(chunk.triples)


EPISODE_ENCODER = EpisodeEncoder()


# --- decoding ---------------------------------------------------------------------------


class _Mark:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Reader:
    """Reads chunks in order: their values, their triples into ``tokens``, the last one's boundary."""

    def __init__(self, tokens: EpisodeTokens) -> None:
        self.tokens = tokens
        self.texts: list[str] = []
        self.decoded: dict[int, Any] = {}
        self.own_base: tuple[int, ...] = ()

    def read(self, data: bytes) -> str:
        chunk = _Chunk.decode(data)
        if chunk.value_base != len(self.texts) or chunk.triple_base != len(self.tokens):
            raise ValueError(
                f"a chunk starts at value {chunk.value_base} and triple {chunk.triple_base}, the chunks before end at "
                f"{len(self.texts)} and {len(self.tokens)}"
            )
        self.texts.extend(chunk.values)
        for kind, data_ in chunk.triples:
            if kind == _LEDGER:
                self.tokens.restored(data_.decode(), None)
                continue
            triple, end = token_codec.decode(data_)
            if end != len(data_):
                raise token_codec.TokenCodecError("bytes after a triple")
            tokens = triple.tokens(self.own_base)
            self.tokens.restored(None, tokens)
            self.own_base = tokens.sequence()
        return chunk.root

    def value(self, text: str) -> Any:
        return json.loads(text, object_hook=self._hook)

    def _ref(self, index: int) -> Any:
        if index not in self.decoded:
            if not 0 <= index < len(self.texts):
                raise ValueError(f"a reference to value {index}, of {len(self.texts)}")
            self.decoded[index] = self.value(self.texts[index])
        return self.decoded[index]

    def _hook(self, node: dict[str, Any]) -> Any:
        if len(node) == 1:
            ((key, item),) = node.items()
            if key == "$v":
                return self._ref(item)
            if key == "$t":
                return _Mark(item)
            if key == "$d":
                return {k: v for k, v in item}
        marks = [node.get(f) for f in FIELDS]
        if any(isinstance(m, _Mark) for m in marks):
            if not all(isinstance(m, _Mark) and m.index == marks[0].index for m in marks):  # type: ignore[union-attr]
                raise ValueError("a call's token fields that are not one triple")
            index = marks[0].index  # type: ignore[union-attr]
            if not 0 <= index < len(self.tokens):
                raise ValueError(f"a reference to triple {index}, of {len(self.tokens)}")
            triple = self.tokens.triples[index]
            for position, name in enumerate(FIELDS):
                node[name] = Pending(index, name) if triple is None else triple.arrays()[position]
        return node


def decode_chunks(chunks: list[bytes], tokens: EpisodeTokens) -> dict[str, Any]:
    """The boundary (its data) the last chunk ends with; fills ``tokens`` with every triple. Raises ``ValueError``
    (or :class:`~gym_services.base.token_codec.TokenCodecError`) for chunks that do not read."""
    reader = _Reader(tokens)
    root = ""
    for data in chunks:
        root = reader.read(data)
    value = reader.value(root)
    if not isinstance(value, dict):
        raise ValueError("the boundary is not a JSON object")
    return value


def restored_log(chunks: list[bytes], boundary: Boundary, tokens: EpisodeTokens) -> EpisodeLog:
    last = _Chunk.decode(chunks[-1])
    return EpisodeLog(
        chunks=list(chunks),
        boundary=boundary,
        values=last.value_base + len(last.values),
        triples=len(tokens),
    )
