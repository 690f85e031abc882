"""The binary form of the training triple (``base/token_codec.py``) and the token arrays (``base/token_arrays.py``):
every token once, 4 bytes per id and per log-prob, nothing lost."""

from __future__ import annotations

import math
import random
import struct
from array import array

import pydantic_core
import pytest

from gym_services.base import token_codec
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import Tokens


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def rollout(turns: int, seed: int = 1, *, exact: bool = True) -> list[Tokens]:
    """A rollout's calls: each prompt is the previous prompt, its answer and 300 new ids."""
    rng = random.Random(seed)
    calls, sequence = [], []
    for _ in range(turns):
        prompt = sequence + [rng.randrange(150_000) for _ in range(300)]
        generated = [rng.randrange(150_000) for _ in range(40)]
        log_probs = [f32(-5 * rng.random()) if exact else -5 * rng.random() for _ in generated]
        calls.append(Tokens.of(prompt, generated, log_probs))
        sequence = prompt + generated
    return calls


def test_a_rollout_costs_its_new_ids_and_its_log_probs_four_bytes_each() -> None:
    calls = rollout(12)
    data = token_codec.encode_all(calls)
    floor = 4 * len(calls[-1].sequence()) + 4 * sum(len(c.generation_log_probs) for c in calls)
    assert floor < len(data) < floor + 8 * len(calls)  # a few bytes of lengths per call
    assert token_codec.decode_all(data) == calls
    assert sum(len(c.prompt_token_ids) for c in calls) * 4 > 5 * len(data)  # the prompts whole: the square of turns


def test_nothing_is_lost() -> None:
    """Log-probs float32 cannot hold are float64; ids past 2**32 are 8 bytes; -0.0, infinities and NaN's bits stay."""
    odd = [-0.0, -math.inf, 0.1, 1e-300, float("nan"), -1.5]
    wide = Tokens.of([1, 2**40, 3], [2**33, 7, 0, 5, 6, 9], odd)
    for calls in ([wide], rollout(3, exact=False), rollout(3)):
        back = token_codec.decode_all(token_codec.encode_all(calls))
        for a, b in zip(back, calls, strict=True):
            assert a.prompt_token_ids == b.prompt_token_ids and a.generation_token_ids == b.generation_token_ids
            assert array("d", a.generation_log_probs).tobytes() == array("d", b.generation_log_probs).tobytes()
    assert token_codec.log_probs_array([f32(-0.3), -0.0]).typecode == "f"
    assert token_codec.log_probs_array([-0.3]).typecode == "d"
    with pytest.raises(ValueError):
        token_codec.ids_array([-1])


def test_a_prompt_re_tokenized_by_a_chat_template_costs_the_ids_after_the_change() -> None:
    first = Tokens.of(list(range(1000)), [5000, 5001], [-0.5, -0.25])
    changed = list(range(600)) + [9, 9, 9] + list(range(600, 1000)) + [7000] * 50  # the history re-tokenized
    second = Tokens.of(changed, [8], [-1.0])
    data = token_codec.encode_all([first, second])
    (triple, _) = token_codec.decode(data, len(token_codec.encode_all([first])))
    assert triple.shared == 600 and len(triple.fresh) == len(changed) - 600
    assert token_codec.decode_all(data) == [first, second]


@pytest.mark.parametrize("cut", [1, 3, 10, -1])
def test_truncated_bytes_are_refused(cut: int) -> None:
    data = token_codec.encode_all(rollout(2))
    with pytest.raises(token_codec.TokenCodecError):
        token_codec.decode_all(data[:cut] if cut >= 0 else data + b"\x00")


def test_a_triple_sharing_more_ids_than_its_base_is_refused() -> None:
    data = token_codec.encode_all(rollout(2))
    with pytest.raises(token_codec.TokenCodecError):
        token_codec.decode_all(data[len(token_codec.encode_all(rollout(1))) :])  # its base left out


def test_common_prefix() -> None:
    assert token_codec.common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert token_codec.common_prefix([], [1]) == 0
    a = array("I", range(5000))
    b = array("I", [*range(3333), 0, *range(3334, 5000)])
    assert token_codec.common_prefix(a, b) == 3333 and token_codec.common_prefix(a, a) == 5000


def test_a_token_array_is_the_list_it_stands_for() -> None:
    base = TokenArray.of([1, 2, 3, 4])
    prompt = TokenArray(array("I", [9, 8]), base=base, shared=3)
    assert prompt == [1, 2, 3, 9, 8] and prompt == (1, 2, 3, 9, 8) and prompt != [1, 2, 3, 9]
    assert prompt.nbytes == 8 and len(prompt) == 5 and prompt[3] == 9 and prompt[-1] == 8 and prompt[1:3] == [2, 3]
    assert pydantic_core.to_json({"ids": prompt}) == b'{"ids":[1,2,3,9,8]}'
    log_probs = TokenArray(token_codec.log_probs_array([f32(-0.3), -1.0]))
    assert log_probs.typecode == "f" and log_probs == [f32(-0.3), -1.0] and log_probs != [-0.3, -1.0]
    assert pydantic_core.to_json([log_probs]) == pydantic_core.to_json([[f32(-0.3), -1.0]])
