"""Token arrays: the token fields of a response held compactly where a server keeps many of them (an agent's
episodes), 4 bytes per id and per log-prob, and the ids a prompt shares with the call it continues held once.

NeMo Gym's output items carry each call's ``prompt_token_ids`` (the whole conversation so far),
``generation_token_ids`` and ``generation_log_probs``. As Python lists, a rollout's items cost 30-40 bytes per id and
the square of its turns (every prompt repeats the ones before). A :class:`TokenArray` is an immutable sequence over
an :mod:`array`; a prompt's array names the sequence it continues (``base``, the previous call's prompt + generated
ids) and how many of its ids it shares, and holds only the rest: a rollout's arrays cost its distinct ids once.

A token array is a value in JSON: pydantic (any field typed ``Any``, :func:`pydantic_core.to_json`) writes it as the
list it stands for, and it compares equal to that list, tuple or array. It is never changed once made.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from pydantic_core import SchemaSerializer, core_schema


class TokenArray(Sequence[Any]):
    """An immutable sequence of token ids or log-probs: the first ``shared`` items of ``base``, then ``tail``."""

    __slots__ = ("_base", "_len", "_shared", "_tail")

    def __init__(self, tail: array[Any], base: TokenArray | None = None, shared: int = 0) -> None:
        if base is None:
            shared = 0
        elif not 0 <= shared <= len(base):
            raise ValueError(f"shares {shared} items with a base of {len(base)}")
        self._base = base if shared else None
        self._shared = shared
        self._tail = tail
        self._len = shared + len(tail)

    @classmethod
    def of(cls, values: Sequence[Any] | array[Any], typecode: str = "I") -> TokenArray:
        return cls(values if isinstance(values, array) else array(typecode, values))

    @property
    def typecode(self) -> str:
        return self._tail.typecode

    @property
    def base(self) -> TokenArray | None:
        return self._base

    @property
    def shared(self) -> int:
        return self._shared

    @property
    def tail(self) -> array[Any]:
        """The items after the shared ones (do not change it)."""
        return self._tail

    @property
    def nbytes(self) -> int:
        """The bytes this array holds itself (not its base's)."""
        return len(self._tail) * self._tail.itemsize

    def __len__(self) -> int:
        return self._len

    def values(self) -> array[Any]:
        """The items as one new array."""
        segments: list[tuple[array[Any], int]] = []  # (array, how many of its items), innermost last
        node: TokenArray | None = self
        take = self._len
        while node is not None and take:
            own = take - node._shared
            if own > 0:
                segments.append((node._tail, own))
            take = min(take, node._shared)
            node = node._base
        out = array(self._tail.typecode)
        for values, count in reversed(segments):
            out.extend(values[:count] if count < len(values) else values)
        return out

    def tolist(self) -> list[Any]:
        return self.values().tolist()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values())

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return self.values()[index].tolist()
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("token array index out of range")
        if index >= self._shared:
            return self._tail[index - self._shared]
        assert self._base is not None
        return self._base[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenArray):
            if other is self:
                return True
            if len(other) != self._len:
                return False
            return _same(self.values(), other.values())
        if isinstance(other, (list, tuple, array)):
            if len(other) != self._len:
                return False
            mine = self.values()
            try:
                # floats are read as float64: a float32 array equals only the values it holds exactly
                theirs = other if isinstance(other, array) else array("d" if mine.typecode in "fd" else "Q", other)
            except (TypeError, OverflowError):
                return False
            return _same(mine, theirs)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.values().tobytes())

    def __repr__(self) -> str:
        return f"TokenArray({self.tolist()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenArray, (self.values(),))


def _same(a: array[Any], b: array[Any]) -> bool:
    """Equal item for item; log-probs bit for bit (so a float32 array equals the float64 values it came from)."""
    if a.typecode == b.typecode:
        return a == b
    if a.typecode in "fd" or b.typecode in "fd":
        return array("d", a).tobytes() == array("d", b).tobytes()
    return a == b


TokenArray.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(
        serialization=core_schema.plain_serializer_function_ser_schema(
            TokenArray.tolist, return_schema=core_schema.list_schema(), when_used="json"
        )
    )
)
