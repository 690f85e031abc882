"""The training triple: one model call's tokens, exactly as the engine sampled them.

A trainer learns from three arrays per model call: the prompt's token ids as the engine tokenized them,
the generated token ids, and each generated token's sampled log-prob. :class:`Tokens` is that triple,
under NeMo Gym's field names (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``,
the names of its ``…__training`` output items and of its ``TokenEntry``), everywhere in the code: the
engines continue a cut generation from one, a generation reports one when it finishes, a prefix record
restores one, and the policy model records one per call into its token ledger.

Formats written before this type keep their own field names (the prefix record's ``token_ids`` and
``log_probs``); they are read into a :class:`Tokens` at their edge, and nothing else names the triple
another way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: NeMo Gym's names of the three arrays, in the order its output items carry them
FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@dataclass(frozen=True, slots=True)
class Tokens:
    """One model call's prompt ids, generated ids and their sampled log-probs (one log-prob per generated id).

    ``generation_token_ids`` may be empty (a call cut before its first token, or one that generated
    nothing); the prompt's ids are always known: a call whose engine never reported them has no
    :class:`Tokens` at all. Each field is an immutable sequence: a tuple, or where many prompts are held at
    once (live generations, staged prefixes) a compact token array (:mod:`gym_services.base.token_arrays`,
    4 bytes an id), which compares equal to the tuple it stands for."""

    prompt_token_ids: Sequence[int]
    generation_token_ids: Sequence[int] = ()
    generation_log_probs: Sequence[float] = ()

    def __post_init__(self) -> None:
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"{len(self.generation_token_ids)} generated token ids but {len(self.generation_log_probs)} log-probs"
            )

    @classmethod
    def of(
        cls, prompt_token_ids: Iterable[int], generation_token_ids: Iterable[int], generation_log_probs: Iterable[float]
    ) -> Tokens:
        """From any sequences (lists as parsed from JSON, the lists a generation grows)."""
        return cls(tuple(prompt_token_ids), tuple(generation_token_ids), tuple(generation_log_probs))

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Tokens:
        """From a mapping with NeMo Gym's three fields (an output item, a ledger entry's JSON)."""
        return cls.of(*(fields[name] for name in FIELDS))

    def fields(self) -> dict[str, list[Any]]:
        """NeMo Gym's three fields, as JSON lists, in NeMo Gym's order."""
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "generation_token_ids": list(self.generation_token_ids),
            "generation_log_probs": list(self.generation_log_probs),
        }

    def sequence(self) -> tuple[int, ...]:
        """The prompt's ids followed by the generated ids: what a continuation is conditioned on, and the
        prompt of the call that continues this one (NeMo Gym's cumulative token ids)."""
        return (*self.prompt_token_ids, *self.generation_token_ids)
