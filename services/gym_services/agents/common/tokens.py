"""An episode's token triples: every model call's prompt ids, generated ids and log-probs it holds, each once.

NeMo Gym's output items carry a call's tokens (``prompt_token_ids``, ``generation_token_ids``,
``generation_log_probs``), and a boundary holds the same call's tokens several times (its outputs, the last response,
the verify answer's echo), each prompt repeating the whole conversation before it. An episode keeps one table of
:class:`Triple` s; the boundaries it records hold the table's :class:`~gym_services.base.token_arrays.TokenArray` s
in place of lists (:meth:`EpisodeTokens.intern`), each prompt sharing its ids with the call before. So an episode
costs its distinct tokens once, 4 bytes each, and a boundary copied to the next costs no token.

A triple the policy model recorded in its token ledger knows that call's id there (``call``: the answer's
``x-ng-token-ledger-call`` header): an episode's checkpoint records name the call instead of writing its tokens
again, and a restored episode reads them back from the ledger (:meth:`EpisodeTokens.hydrate`) before its next step
(``docs/decisions.md``, "The agent's transcript names the ledger's tokens").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic_core import SchemaSerializer, core_schema

from gym_services.base import token_codec
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import FIELDS, Tokens

#: the header with which the policy model names the ledger call that recorded an answer's tokens
LEDGER_CALL_HEADER = "x-ng-token-ledger-call"


@dataclass(frozen=True, slots=True)
class Triple:
    """One call's tokens as arrays (``prompt`` written against the previous triple's ``sequence``), and the ledger
    call that recorded them, if any."""

    prompt: TokenArray
    generated: TokenArray
    log_probs: TokenArray
    call: str | None = None

    @property
    def sequence(self) -> TokenArray:
        """The prompt and the generated ids (what the next call's prompt continues)."""
        return TokenArray(self.generated.tail, base=self.prompt, shared=len(self.prompt))

    def arrays(self) -> tuple[TokenArray, TokenArray, TokenArray]:
        return self.prompt, self.generated, self.log_probs

    def tokens(self) -> Tokens:
        return Tokens(tuple(self.prompt.values()), tuple(self.generated.tail), tuple(self.log_probs.tail))


class Pending:
    """In a restored boundary, one token field of a triple the token ledger holds, until the episode reads it back
    (:meth:`EpisodeTokens.hydrate`). Never written to the wire: serializing one is an error."""

    __slots__ = ("field", "index")

    def __init__(self, index: int, field: str) -> None:
        self.index, self.field = index, field

    def __repr__(self) -> str:
        return f"Pending({self.index}, {self.field!r})"


def _unsent(value: Pending) -> Any:
    raise ValueError(f"token triple {value.index} is still in the token ledger (the episode was not hydrated)")


Pending.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(serialization=core_schema.plain_serializer_function_ser_schema(_unsent, when_used="json"))
)


def is_triple(value: dict[str, Any]) -> bool:
    """A dict carrying NeMo Gym's three token fields."""
    return all(field in value for field in FIELDS)


class EpisodeTokens:
    """The triples one episode holds, in the order it met them. Append-only: a capture takes its length."""

    __slots__ = ("_by_prompt", "_by_shape", "_pending", "triples")

    def __init__(self) -> None:
        #: None: a triple the ledger holds that the episode has not read back yet (its ``call`` in :attr:`_pending`)
        self.triples: list[Triple | None] = []
        self._by_prompt: dict[int, int] = {}  # id() of a triple's prompt array -> its index (the table keeps it alive)
        self._by_shape: dict[tuple[int, int], list[int]] = {}
        self._pending: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.triples)

    @property
    def pending(self) -> dict[int, str]:
        """Index -> ledger call id of the triples still to read back from the token ledger."""
        return self._pending

    def index_of(self, prompt: object) -> int | None:
        """The index of the triple whose prompt array this is (the same object), if any."""
        return self._by_prompt.get(id(prompt))

    def _last_sequence(self) -> TokenArray | None:
        for triple in reversed(self.triples):
            if triple is not None:
                return triple.sequence
        return None

    def _register(self, triple: Triple) -> Triple:
        index = len(self.triples)
        self.triples.append(triple)
        self._by_prompt[id(triple.prompt)] = index
        self._by_shape.setdefault((len(triple.prompt), len(triple.generated)), []).append(index)
        return triple

    def _find(self, prompt: Any, generated: Any, log_probs: Any) -> Triple | None:
        for index in self._by_shape.get((len(prompt), len(generated)), ()):
            triple = self.triples[index]
            if (
                triple is not None
                and triple.generated == generated
                and triple.log_probs == log_probs
                and triple.prompt == prompt
            ):
                return triple
        return None

    def add(self, prompt: Any, generated: Any, log_probs: Any, call: str | None = None) -> Triple:
        """The table's triple of these values: the one it holds already, or a new one (its prompt written against
        the last triple's sequence)."""
        found = self._find(prompt, generated, log_probs)
        if found is not None:
            return found
        return self._register(_made(prompt, generated, log_probs, call, self._last_sequence()))

    def intern(self, value: Any, *, known: bool = False) -> int:
        """Replace, in place, every triple's token lists in ``value`` (a freshly made boundary's data) with the
        table's arrays; returns how many it replaced. Arrays of this table are left as they are; another table's are
        replaced like lists. With ``known``, only lists equal to a triple the table holds are replaced (a downstream
        answer echoing the episode's calls), and the table gains none."""
        replaced = 0
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                prompt = node.get("prompt_token_ids")
                foreign = isinstance(prompt, TokenArray) and self.index_of(prompt) is None
                if is_triple(node) and (isinstance(prompt, (list, tuple)) or foreign):
                    try:
                        fields = [node[f] for f in FIELDS]
                        triple = self._find(*fields) if known else self.add(*fields)
                    except (TypeError, ValueError, OverflowError):
                        triple = None  # not token ids (a value a server made up): left as it is
                    if triple is not None:
                        for field, arrays in zip(FIELDS, triple.arrays(), strict=True):
                            node[field] = arrays
                        replaced += 1
                stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
            elif isinstance(node, list):
                stack.extend(v for v in node if isinstance(v, (dict, list)))
        return replaced

    # --- restore ---------------------------------------------------------------------

    def restored(self, call: str | None, tokens: Tokens | None) -> int:
        """Append a triple read back from a checkpoint: its tokens, or (``tokens`` None) a triple the ledger holds
        under ``call``, to read back later."""
        if tokens is None:
            if call is None:
                raise ValueError("a restored triple without tokens names its ledger call")
            self._pending[len(self.triples)] = call
            self.triples.append(None)
            return len(self.triples) - 1
        made = _made(
            tokens.prompt_token_ids,
            tokens.generation_token_ids,
            tokens.generation_log_probs,
            call,
            self._last_sequence(),
        )
        self._register(made)
        return len(self.triples) - 1

    def hydrate(self, read: Iterable[tuple[int, Tokens]]) -> None:
        """Fill the pending triples with the tokens the ledger answered (index, tokens), in order."""
        for index, tokens in read:
            call = self._pending.pop(index)
            base = next((t.sequence for t in reversed(self.triples[:index]) if t is not None), None)
            triple = _made(
                tokens.prompt_token_ids, tokens.generation_token_ids, tokens.generation_log_probs, call, base
            )
            self.triples[index] = triple
            self._by_prompt[id(triple.prompt)] = index
            self._by_shape.setdefault((len(triple.prompt), len(triple.generated)), []).append(index)

    def substitute(self, value: Any) -> Any:
        """A copy of ``value`` (a boundary's data) with every :class:`Pending` field replaced by its triple's
        array (once hydrated)."""
        if isinstance(value, Pending):
            triple = self.triples[value.index]
            if triple is None:
                raise ValueError(f"token triple {value.index} was not read back from the ledger")
            return triple.arrays()[FIELDS.index(value.field)]
        if isinstance(value, dict):
            return {k: self.substitute(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.substitute(v) for v in value]
        return value

    def nbytes(self) -> int:
        """The bytes its arrays hold."""
        return sum(sum(a.nbytes for a in t.arrays()) for t in self.triples if t is not None)


def _values(value: Any) -> Any:
    return value.values() if isinstance(value, TokenArray) else value


def _made(prompt: Any, generated: Any, log_probs: Any, call: str | None, base: TokenArray | None) -> Triple:
    """A triple of these values, its prompt written against ``base`` (sharing their common prefix)."""
    ids = token_codec.ids_array(_values(prompt))
    shared = token_codec.common_prefix(ids, base.values()) if base is not None else 0
    return Triple(
        TokenArray(ids[shared:], base=base, shared=shared) if base is not None else TokenArray(ids),
        TokenArray(token_codec.ids_array(_values(generated))),
        TokenArray(token_codec.log_probs_array(_values(log_probs))),
        call,
    )
