"""Task create params shared by the live episodes that run the same task.

RL collects several rollouts of each task at once (a group per prompt), and every live episode holds its task row
for its whole life. A row's ``responses_create_params`` (its input, tools and instructions) is most of a long
context's first prompt: at 32k-token contexts about 64 KB of JSON, several times that as Python objects. Equal
params are one object, the first live episode's, found by the digest of their JSON, for as long as an episode
holds them (a weak reference: nothing is kept for a task no episode runs). Episodes a restore reads back from
their chunks share them the same way.

A row is never changed once its episode has it (a boundary is never changed once made; the steps read the params
and make their own copies), so one object can stand for all of them.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import pydantic_core


class _Params(dict[str, Any]):
    """Create params that can be referenced weakly (a plain dict cannot be)."""

    __slots__ = ("__weakref__",)


class SharedParams:
    """The create params the live episodes hold, by the digest of their JSON."""

    def __init__(self) -> None:
        self._by_digest: weakref.WeakValueDictionary[bytes, _Params] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._by_digest)

    def share(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with its create params those a live episode holds already if they are equal (as JSON, byte for
        byte), else made the ones the next equal row shares."""
        params = row.get("responses_create_params")
        if not isinstance(params, dict):
            return row
        try:
            digest = hashlib.blake2b(pydantic_core.to_json(params, inf_nan_mode="constants")).digest()
        except pydantic_core.PydanticSerializationError:
            return row  # not JSON values: held as given
        shared = self._by_digest.get(digest)
        if shared is None:
            shared = _Params(params)
            self._by_digest[digest] = shared
        return {**row, "responses_create_params": shared}
