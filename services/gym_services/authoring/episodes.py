"""The episodes a server is checked with (``gymckpt check-server --episodes FILE``): the calls of each, in order.

A YAML or JSON file::

    ignore_fields: [session_id]     # answer fields that differ between two runs by design (ids a server mints)
    episodes:
      - - {path: /seed_session, json: {}}
        - {path: /put, json: {key: a, value: "1"}}
        - {path: /verify, json: {expected: {a: "1"}}}
      - ...

Each episode is one session of the server (one cookie jar, one rollout id). The harness
(:mod:`gym_services.authoring.harness`) interleaves the episodes in an order drawn from its seed, and compares
what the server answers with :func:`answer_of`: the status and the JSON body without ``ignore_fields``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base.config import ConfigError


class Call(BaseModel):
    """One request of an episode: ``json`` is the body (none for a GET)."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(default="POST", pattern=r"^(GET|POST|PUT|PATCH|DELETE)$")
    path: str = Field(pattern=r"^/")
    json_body: Any = Field(default=None, alias="json")


class Episodes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ignore_fields: list[str] = Field(default_factory=list, description="answer fields not compared")
    episodes: list[list[Call]] = Field(min_length=1)


def load_episodes(path: str | Path) -> Episodes:
    """The episodes file at ``path``; a :class:`ConfigError` that names what is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read episodes {path}: {exc}") from None
    try:
        episodes = Episodes.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise ConfigError(f"invalid episodes {path}: " + "; ".join(lines)) from None
    if any(not calls for calls in episodes.episodes):
        raise ConfigError(f"invalid episodes {path}: an episode has no calls")
    return episodes


def schedule(episodes: Episodes, seed: int) -> list[tuple[int, int]]:
    """Every call as (episode, index), episodes interleaved in an order drawn from ``seed``; each episode's own
    calls stay in their order."""
    rng = random.Random(seed)
    left = [list(range(len(calls))) for calls in episodes.episodes]
    order: list[tuple[int, int]] = []
    while any(left):
        episode = rng.choice([e for e, calls in enumerate(left) if calls])
        order.append((episode, left[episode].pop(0)))
    return order


def answer_of(status: int, content: bytes, ignore: list[str]) -> dict[str, Any]:
    """What is compared of one answer: the status and the body (JSON without the ``ignore`` fields, else text)."""
    try:
        body: Any = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"status": status, "text": content.decode("utf-8", errors="replace")}
    return {"status": status, "json": _without(body, set(ignore))}


def _without(value: Any, ignore: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_without(v, ignore) for v in value]
    return value
