"""``agents/common/shared_params.py``: equal create params are one object while an episode holds them."""

from __future__ import annotations

import gc
import math

from gym_services.agents.common.shared_params import SharedParams

PARAMS = {"input": [{"role": "user", "content": "plan"}], "tools": [{"type": "function", "name": "t"}]}


def test_equal_params_are_the_first_rows_and_the_rest_of_the_row_is_its_own() -> None:
    shared = SharedParams()
    first = shared.share({"responses_create_params": dict(PARAMS), "id": 1})
    second = shared.share({"responses_create_params": dict(PARAMS), "id": 2})
    assert first["responses_create_params"] is second["responses_create_params"]
    assert first["responses_create_params"]["tools"] is PARAMS["tools"]  # the first row's own objects, not copies
    assert (first["id"], second["id"]) == (1, 2) and first["responses_create_params"] == PARAMS


def test_params_that_differ_as_json_are_not_shared() -> None:
    """Equal as JSON, byte for byte: 1 and 1.0, or keys in another order, are kept apart (never wrongly shared)."""
    shared = SharedParams()
    rows = [
        {"responses_create_params": {"input": [], "temperature": 1}},
        {"responses_create_params": {"input": [], "temperature": 1.0}},
        {"responses_create_params": {"temperature": 1, "input": []}},
    ]
    made = [shared.share(r)["responses_create_params"] for r in rows]
    assert len({id(p) for p in made}) == 3 and len(shared) == 3


def test_nothing_is_kept_once_no_row_holds_them() -> None:
    shared = SharedParams()
    row = shared.share({"responses_create_params": dict(PARAMS)})
    assert len(shared) == 1
    del row
    gc.collect()
    assert len(shared) == 0


def test_a_row_without_params_or_with_values_that_are_not_json_is_held_as_given() -> None:
    shared = SharedParams()
    bare = {"id": 3}
    odd = {"responses_create_params": {"input": [], "seed": object()}}
    assert shared.share(bare) is bare and shared.share(odd) is odd and len(shared) == 0
    non_finite = shared.share({"responses_create_params": {"input": [], "temperature": math.inf}})
    assert non_finite["responses_create_params"]["temperature"] == math.inf and len(shared) == 1
