"""The binary form of :class:`~gym_services.base.tokens.Tokens`: each distinct token once, 4 bytes per id and per
log-prob (``docs/decisions.md``, "Tokens are stored once, in binary, as the delta of each call").

A rollout's model calls repeat each other: a call's prompt is the previous call's prompt, its generated ids and
the new turn's ids. So a triple is written against a **base**, the token sequence it continues (the previous
call's prompt + generated ids; nothing for the first call): only the length of the longest common prefix of the
prompt with the base is written, then the prompt's remaining ids, the generated ids and their log-probs. A chat
template that re-tokenizes the history (the prefix shared with the base is shorter than the base) costs only the
ids after the point where they differ: the layout holds any prompt, whatever it shares.

One triple, little-endian::

    u8      flags      bit 0: log-probs as float64 (else float32); bit 1: ids as uint64 (else uint32)
    varint  shared     the prompt's first ``shared`` ids are the base's first ``shared``
    varint  fresh      the prompt's ids after them
    varint  generated  generated ids, and as many log-probs
    ids     fresh prompt ids, then generated ids
    floats  log-probs

Nothing is lost: log-probs are float32 only when every one of them converts to float32 and back to the same
float64, bit for bit; ids are uint32 only when every one fits. Decoding gives the same
:class:`~gym_services.base.tokens.Tokens` that was encoded.

An **entry** is a triple with the JSON of what goes with it (a ledger entry's other fields): ``varint n``, ``n``
bytes of JSON, the triple. A chain of entries, each triple written against the previous entry's sequence, is the
in-memory form of a rollout's token ledger and what its checkpoint records hold (:func:`write_entry`,
:func:`read_entry`, :func:`entry_sequences`); :class:`TokenChain` is a chain of bare triples.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import Tokens

LOG_PROBS_64 = 0x01
IDS_64 = 0x02
_LITTLE = sys.byteorder == "little"


class TokenCodecError(ValueError):
    """Bytes that do not hold what the layout says (truncated, a bad varint, a base too short)."""


def _ids(values: Iterable[int], wide: bool) -> array[int]:
    return array("Q" if wide else "I", values)


def ids_array(values: Iterable[int]) -> array[int]:
    """Token ids as a compact array: uint32 when every id fits, else uint64; refuses a negative id."""
    values = values if isinstance(values, (list, tuple, array)) else list(values)
    try:
        return array("I", values)
    except OverflowError:
        try:
            return array("Q", values)
        except OverflowError:
            raise ValueError("token ids must be non-negative integers below 2**64") from None


def log_probs_array(values: Sequence[float]) -> array[float]:
    """Log-probs as float32 when that keeps every value bit for bit, else float64."""
    wide = array("d", values)
    narrow = array("f", values)
    if array("d", narrow).tobytes() == wide.tobytes():
        return narrow
    return wide


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id sequences (arrays compare as memory; any sequence
    compares elementwise)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(value: int, out: bytearray) -> None:
    """An unsigned LEB128 integer."""
    if value < 0:
        raise ValueError("a varint is unsigned")
    _varint(value, out)


def read_varint(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """The unsigned LEB128 integer at ``offset``, and the offset after it."""
    value = shift = 0
    while True:
        if offset >= len(data):
            raise TokenCodecError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise TokenCodecError("varint longer than 64 bits")


def _raw(values: array[Any]) -> bytes:
    if _LITTLE:
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def _read_array(typecode: str, data: bytes | memoryview, offset: int, count: int) -> tuple[array[Any], int]:
    values = array(typecode)
    end = offset + count * values.itemsize
    if end > len(data):
        raise TokenCodecError("truncated token ids or log-probs")
    values.frombytes(data[offset:end])
    if not _LITTLE:
        values.byteswap()
    return values, end


def encode(tokens: Tokens, base: Sequence[int] = (), out: bytearray | None = None) -> bytearray:
    """Append the triple, written against ``base`` (the sequence it continues), to ``out``."""
    out = bytearray() if out is None else out
    prompt = ids_array(tokens.prompt_token_ids)
    generated = ids_array(tokens.generation_token_ids)
    shared = common_prefix(prompt, base if isinstance(base, array) else ids_array(base))
    wide = prompt.typecode == "Q" or generated.typecode == "Q"
    fresh, gen = _ids(prompt[shared:], wide), _ids(generated, wide)
    log_probs = log_probs_array(tokens.generation_log_probs)
    out.append((LOG_PROBS_64 if log_probs.typecode == "d" else 0) | (IDS_64 if wide else 0))
    _varint(shared, out)
    _varint(len(fresh), out)
    _varint(len(gen), out)
    out += _raw(fresh)
    out += _raw(gen)
    out += _raw(log_probs)
    return out


@dataclass(frozen=True, slots=True)
class Decoded:
    """One triple as arrays: the prompt's fresh ids after ``shared`` ids of its base, generated ids, log-probs."""

    shared: int
    fresh: array[int]
    generated: array[int]
    log_probs: array[float]

    def prompt(self, base: Sequence[int]) -> array[int]:
        """The whole prompt, given the base it was written against."""
        if self.shared > len(base):
            raise TokenCodecError(f"the prompt shares {self.shared} ids with a base of {len(base)}")
        prompt = _ids(base[: self.shared], self.fresh.typecode == "Q")
        prompt.extend(self.fresh)
        return prompt

    def sequence(self, base: Sequence[int]) -> array[int]:
        """The prompt and the generated ids: what the next call of the rollout is written against."""
        sequence = self.prompt(base)
        sequence.extend(self.generated)
        return sequence

    def tokens(self, base: Sequence[int]) -> Tokens:
        """The call's tokens; its prompt a compact token array (4 bytes an id), the rest tuples."""
        return Tokens(TokenArray(self.prompt(base)), tuple(self.generated), tuple(self.log_probs))


def decode(data: bytes | memoryview, offset: int = 0) -> tuple[Decoded, int]:
    """The triple at ``offset`` (its prompt relative to its base), and the offset after it."""
    if offset >= len(data):
        raise TokenCodecError("truncated triple")
    flags = data[offset]
    if flags & ~(LOG_PROBS_64 | IDS_64):
        raise TokenCodecError(f"unknown triple flags {flags:#x}")
    shared, offset = read_varint(data, offset + 1)
    fresh_n, offset = read_varint(data, offset)
    generated_n, offset = read_varint(data, offset)
    id_code = "Q" if flags & IDS_64 else "I"
    fresh, offset = _read_array(id_code, data, offset, fresh_n)
    generated, offset = _read_array(id_code, data, offset, generated_n)
    log_probs, offset = _read_array("d" if flags & LOG_PROBS_64 else "f", data, offset, generated_n)
    return Decoded(shared, fresh, generated, log_probs), offset


def write_entry(json_part: bytes, tokens: Tokens, base: Sequence[int], out: bytearray) -> bytearray:
    """Append an entry: the JSON's length, the JSON, the triple written against ``base``."""
    _varint(len(json_part), out)
    out += json_part
    return encode(tokens, base, out)


def read_entry(data: bytes | memoryview, offset: int = 0) -> tuple[bytes, Decoded, int]:
    """The JSON and the triple of the entry at ``offset``, and the offset after it."""
    size, start = read_varint(data, offset)
    if start + size > len(data):
        raise TokenCodecError("truncated entry JSON")
    triple, end = decode(data, start + size)
    return bytes(data[start : start + size]), triple, end


def entry_sequences(entries: Iterable[bytes | memoryview]) -> Iterator[array[int]]:
    """Each entry's prompt + generated ids, for a chain of entries each written against the previous one."""
    base: array[int] = array("I")
    for data in entries:
        _, triple, _ = read_entry(data)
        base = triple.sequence(base)
        yield base


def last_sequence(sequences: Iterable[array[int]]) -> array[int]:
    """The last of ``sequences`` (empty when there is none)."""
    last: array[int] = array("I")
    for each in sequences:
        last = each
    return last


def encode_all(calls: Iterable[Tokens], base: Sequence[int] = ()) -> bytes:
    """Triples one after another, each written against the previous one's sequence (the first against ``base``)."""
    out = bytearray()
    for tokens in calls:
        encode(tokens, base, out)
        base = tokens.sequence()
    return bytes(out)


def decode_all(data: bytes | memoryview, count: int | None = None, base: Sequence[int] = ()) -> list[Tokens]:
    """What :func:`encode_all` wrote (``count`` triples, or to the end)."""
    out: list[Tokens] = []
    offset = 0
    while (count is None and offset < len(data)) or (count is not None and len(out) < count):
        triple, offset = decode(data, offset)
        out.append(triple.tokens(base))
        base = triple.sequence(base)
    if count is None and offset != len(data):
        raise TokenCodecError("bytes after the last triple")
    return out


class TokenChain:
    """A rollout's calls in the order they were added, each written against the previous one's sequence: only
    the encoded triples are held (what a checkpoint record holds), so a chain costs its encoded bytes; the
    sequence the next call is written against, and every call's tokens, are decoded from the chain's start
    (arrays: a few memory copies per call).
    """

    __slots__ = ("_encoded",)

    def __init__(self) -> None:
        self._encoded: list[bytes] = []

    def __len__(self) -> int:
        return len(self._encoded)

    @property
    def encoded(self) -> list[bytes]:
        """Each call's triple as written (do not change the list)."""
        return self._encoded

    def add(self, tokens: Tokens) -> bytes:
        """Append a call; returns its triple as written."""
        data = bytes(encode(tokens, last_sequence(self.sequences())))
        self._encoded.append(data)
        return data

    def extend_encoded(self, triples: Iterable[bytes]) -> None:
        """Triples written by another chain (a checkpoint's records), checked and appended in order."""
        base = last_sequence(self.sequences())
        for data in triples:
            triple, end = decode(data)
            if end != len(data):
                raise TokenCodecError("bytes after the triple")
            base = triple.sequence(base)
            self._encoded.append(bytes(data))

    def tokens(self, indices: Iterable[int] | None = None) -> Iterator[tuple[int, Tokens]]:
        """(index, tokens) of every call (or of ``indices`` only, ascending), decoded from the chain's start."""
        wanted = None if indices is None else set(indices)
        base: array[int] = array("I")
        for index, data in enumerate(self._encoded):
            triple, _ = decode(data)
            if wanted is None or index in wanted:
                yield index, triple.tokens(base)
            base = triple.sequence(base)
            if wanted is not None and index >= max(wanted, default=-1):
                return

    def sequences(self) -> Iterator[array[int]]:
        """Each call's prompt and generated ids, in order."""
        base: array[int] = array("I")
        for data in self._encoded:
            triple, _ = decode(data)
            base = triple.sequence(base)
            yield base
