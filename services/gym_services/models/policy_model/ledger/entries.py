"""A rollout's stored ledger entries, each kept in its stored form: the form the ledger holds in memory and the
one its checkpoint records hold (``docs/decisions.md``, "Tokens are stored once, in binary, as the delta of each
call").

One entry's stored form is a token codec entry (:func:`gym_services.base.token_codec.write_entry`): the
``LedgerEntry``'s JSON without ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs`` (every other
field, unknown ones included, as stored), then its tokens written against the previous entry's prompt + generated
ids (the first entry against nothing).

So a call whose prompt is the previous call's prompt, its answer and a new turn costs the new turn's ids, its
generated ids and their log-probs, 4 bytes each, and its output items. An entry is decoded back into the
:class:`~.wire.LedgerEntry` that was stored: the same canonical JSON, so a trainer reads exactly what was put.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator

from gym_services.base import token_codec
from gym_services.base.tokens import FIELDS, Tokens
from gym_services.models.policy_model.ledger.wire import LedgerEntry

_EXCLUDED = set(FIELDS)


def _rest(entry: LedgerEntry) -> bytes:
    return entry.model_dump_json(exclude=_EXCLUDED).encode()


_split = token_codec.read_entry


def split_stored(data: bytes | memoryview) -> list[bytes]:
    """Stored entries laid end to end (a checkpoint's chunk), each as its own bytes."""
    out: list[bytes] = []
    offset = 0
    while offset < len(data):
        _, _, end = _split(data, offset)
        out.append(bytes(data[offset:end]))
        offset = end
    return out


class EntryLog:
    """One rollout's entries in the order they were stored, by call id; only their stored forms are held."""

    __slots__ = ("_calls", "_nbytes", "_stored")

    def __init__(self) -> None:
        self._stored: list[bytes] = []
        self._calls: dict[str, int] = {}
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._stored)

    def __contains__(self, model_call_id: object) -> bool:
        return model_call_id in self._calls

    def __bool__(self) -> bool:
        return bool(self._stored)

    @property
    def stored(self) -> list[bytes]:
        """Each entry's stored form, in order (do not change the list)."""
        return self._stored

    @property
    def nbytes(self) -> int:
        """The stored forms' bytes."""
        return self._nbytes

    def call_ids(self) -> list[str]:
        return list(self._calls)

    def first_call_id(self) -> str | None:
        """The call id of the first entry (none while empty)."""
        return next(iter(self._calls), None)

    def index(self, model_call_id: str) -> int | None:
        return self._calls.get(model_call_id)

    def sequences(self) -> Iterator[array[int]]:
        """Each entry's prompt + generated ids, in order."""
        return token_codec.entry_sequences(self._stored)

    def append(self, entry: LedgerEntry) -> None:
        """Store a new call's entry (the caller checked its call id is not stored yet)."""
        stored = token_codec.write_entry(
            _rest(entry), entry.tokens(), token_codec.last_sequence(self.sequences()), bytearray()
        )
        self._calls[entry.model_call_id] = len(self._stored)
        self._stored.append(bytes(stored))
        self._nbytes += len(stored)

    def same(self, index: int, entry: LedgerEntry) -> bool:
        """Whether ``entry`` is the payload stored at ``index`` (every field, log-probs bit for bit)."""
        rest, triple, _ = _split(self._stored[index])
        if rest != _rest(entry):
            return False
        base = array("I")
        for i, sequence in enumerate(self.sequences()):
            if i == index:
                break
            base = sequence
        stored = triple.tokens(base)
        new = entry.tokens()
        return (
            stored.prompt_token_ids == new.prompt_token_ids
            and stored.generation_token_ids == new.generation_token_ids
            and array("d", stored.generation_log_probs).tobytes() == array("d", new.generation_log_probs).tobytes()
        )

    def tokens(self, indices: Iterable[int]) -> Iterator[tuple[int, Tokens]]:
        """(index, tokens) of these entries, ascending, decoded from the first."""
        wanted = set(indices)
        base: array[int] = array("I")
        for index, stored in enumerate(self._stored):
            if not wanted:
                return
            _, triple, _ = _split(stored)
            if index in wanted:
                wanted.discard(index)
                yield index, triple.tokens(base)
            base = triple.sequence(base)

    def entries(self) -> list[LedgerEntry]:
        """Every entry, decoded."""
        out: list[LedgerEntry] = []
        base: array[int] = array("I")
        for stored in self._stored:
            rest, triple, _ = _split(stored)
            fields = json.loads(rest)
            prompt = triple.prompt(base)
            fields["prompt_token_ids"] = prompt.tolist()
            fields["generation_token_ids"] = triple.generated.tolist()
            fields["generation_log_probs"] = triple.log_probs.tolist()
            out.append(LedgerEntry.model_validate(fields))
            base = prompt
            base.extend(triple.generated)
        return out

    @classmethod
    def of_stored(cls, rollout_id: str, stored: Iterable[bytes]) -> EntryLog:
        """A log from stored forms read back (a checkpoint's chunks): each checked to decode, to belong to
        ``rollout_id`` and to name a call not stored before; raises ``ValueError`` otherwise."""
        log = cls()
        base: array[int] = array("I")
        for data in stored:
            rest, triple, end = _split(data)
            if end != len(data):
                raise token_codec.TokenCodecError("bytes after the entry")
            fields = json.loads(rest)
            if not isinstance(fields, dict):
                raise ValueError("an entry that is not a JSON object")
            # every field but the arrays, checked as a trainer would read it (the arrays are the codec's)
            entry = LedgerEntry.model_validate({**fields, **dict.fromkeys(FIELDS, ())})
            if entry.rollout_id != rollout_id:
                raise ValueError(f"an entry of another rollout ({entry.rollout_id!r})")
            call = entry.model_call_id
            if call in log._calls:
                raise ValueError(f"call {call!r} is stored twice")
            base = triple.sequence(base)  # checks the triple fits its base
            log._calls[call] = len(log._stored)
            log._stored.append(bytes(data))
            log._nbytes += len(data)
        return log

    @classmethod
    def of_entries(cls, entries: Iterable[LedgerEntry]) -> EntryLog:
        log = cls()
        for entry in entries:
            log.append(entry)
        return log
