"""A checkpoint leaves nothing behind in the server it ran on: after the first few (caches and bounded histories
filling), a hundred more add no objects. A server checkpointed every 30 s runs thousands a day (every
server once kept the closing answer of every checkpoint it ever took).

The counter resource server carries the whole control plane and a session store without a library of its own:
the Workplace server's pandas keeps a list of weak references per shared block that it prunes only now and then,
which would read as growth here."""

from __future__ import annotations

import gc
import types
import weakref
from collections import Counter

from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.control.repeats import CLOSED_KEPT
from gym_services.resources.counter.app import Config, create_app

IDENT = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}
WARM_UP = 2 * CLOSED_KEPT
MORE = 120


def abc_cache_entry(o: object) -> bool:
    """A weak reference in an abstract base class's subclass-check cache, or its callback (CPython's ``_abc``):
    here the ``generator`` class filed under ``Mapping``'s subclasses, one more about every checkpoint (107 after
    120). Bounded by the classes that exist, and not this project's objects."""
    if type(o) is weakref.ReferenceType:
        return getattr(o.__callback__, "__name__", "") == "_destroy"
    return type(o) is types.BuiltinFunctionType and o.__name__ == "_destroy"


def live_objects() -> Counter[str]:
    gc.collect()
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects() if not abc_cache_entry(o))


async def test_a_hundred_more_checkpoints_add_no_objects(tmp_path) -> None:
    app = create_app(load_config(Config, overrides=base_config("counter")))
    location = f"file://{tmp_path / 'store'}"
    async with serve(app) as client:
        control = Control(client)
        assert (await client.post("/seed_session", json={"start": 1}, headers=IDENT)).status_code == 200
        for i in range(WARM_UP):
            await control.checkpoint_background(f"warm-{i}", location, ["r1"])
        before = live_objects()
        for i in range(MORE):
            assert (await control.checkpoint_background(f"ck-{i}", location, ["r1"]))["records"] >= 1
            # a repeated resume gets the first one's answer, from the closings kept
            assert (await control.resume(f"ck-{i}"))["checkpoint_id"] == f"ck-{i}"
        after = live_objects()
    grown = {kind: after[kind] - before[kind] for kind in after if after[kind] - before[kind] > MORE // 4}
    assert not grown, f"objects that grew with {MORE} checkpoints: {grown}"
