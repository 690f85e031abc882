"""An agent's episodes in a checkpoint: the records a capture takes of them, and the episodes a restore reads back
from those records (``docs/protocol.md``, "The episode record"; the chunks' layout and encoder: :mod:`.records`).

A capture takes references only (a boundary is never changed once made, its chunks are bytes); the new chunk is
made after resume. Each episode in scope is a head record and the chunks it names; a finished episode whose result
the controller still waits for is saved too (its ``return`` boundary, one chunk). Restore reads a head (schema 2:
with its chunks; schema 1: the boundary whole) into an episode of attempt + 1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from gym_services.agents.common.boundary import Boundary, EpisodeRecord
from gym_services.agents.common.episode import Episode
from gym_services.agents.common.finished import FinishedEpisode
from gym_services.agents.common.records import (
    EPISODE_KIND,
    EPISODE_SCHEMA_VERSION,
    MAX_CHUNKS,
    EpisodeHead,
    EpisodeLog,
    FrozenChunk,
    FrozenEpisode,
    FrozenHead,
    decode_chunks,
    episode_chunk_key,
    restored_log,
)
from gym_services.agents.common.tokens import EpisodeTokens
from gym_services.base.token_codec import TokenCodecError
from gym_services.control.participant import FrozenRecord, InvalidState, RestoredRecord, Scope


def episode_record_key(rollout_id: str) -> str:
    key = f"episode-{rollout_id}"
    if len(key) <= 200:
        return key
    return "episode-sha256-" + hashlib.sha256(rollout_id.encode()).hexdigest()


def capture_records(
    episodes: Iterable[Episode],
    finished: Iterable[FinishedEpisode],
    scope: Scope,
    agent: str,
    boundary_model: type[Boundary],
) -> list[FrozenRecord[FrozenEpisode]]:
    """The records of every episode in scope as it is now, and of every finished one the controller still waits
    for. Chunks come first, then the heads: packs fill in this order, so the chunks later checkpoints reference
    share packs with few records they do not."""
    chunks: list[FrozenRecord[FrozenEpisode]] = []
    heads: list[FrozenRecord[FrozenEpisode]] = []
    for ep in episodes:
        if ep.anonymous or not scope.includes(ep.rollout_id):
            continue
        if ep.waited:
            raise InvalidState(f"episode {ep.rollout_id} is inside waited step {ep.step!r}; it has no boundary yet")
        parts = _parts(ep)
        chunks.extend(_chunk_records(ep.rollout_id, ep.attempt, parts))
        heads.append(_head_record(agent, ep.rollout_id, ep.attempt, len(parts)))
    # a finished result is saved only when the controller says it still waits for it
    for done in finished:
        if scope.episodes is None or done.rollout_id not in scope.episodes or not scope.includes(done.rollout_id):
            continue
        whole = FrozenChunk(EpisodeLog(), finished=done.boundary, boundary_model=boundary_model)
        chunks.extend(_chunk_records(done.rollout_id, done.attempt, [whole]))
        heads.append(_head_record(agent, done.rollout_id, done.attempt, 1))
    return [*chunks, *heads]


def _parts(ep: Episode) -> list[FrozenChunk]:
    """The episode's chunks: those its checkpoints hold, and a new one when it moved since (past
    :data:`~.records.MAX_CHUNKS`, one new chunk holding it whole)."""
    log = ep.log
    earlier = tuple(log.chunks)
    if ep.boundary is log.boundary and earlier:
        return [FrozenChunk(log, data=data) for data in earlier]
    if len(earlier) >= MAX_CHUNKS:
        earlier = ()
    new = FrozenChunk(log, earlier=earlier, boundary=ep.boundary, tokens=ep.tokens, triples=len(ep.tokens))
    return [*(FrozenChunk(log, data=data) for data in earlier), new]


def _chunk_records(rollout_id: str, attempt: int, parts: list[FrozenChunk]) -> list[FrozenRecord[FrozenEpisode]]:
    key = episode_record_key(rollout_id)
    return [
        FrozenRecord(episode_chunk_key(key, i), part, rollout_id=rollout_id, attempt=attempt)
        for i, part in enumerate(parts)
    ]


def _head_record(agent: str, rollout_id: str, attempt: int, chunks: int) -> FrozenRecord[FrozenEpisode]:
    head = {
        "schema_version": EPISODE_SCHEMA_VERSION,
        "kind": EPISODE_KIND,
        "agent": agent,
        "rollout_id": rollout_id,
        "attempt": attempt,
        "chunks": chunks,
    }
    return FrozenRecord(episode_record_key(rollout_id), FrozenHead(head), rollout_id=rollout_id, attempt=attempt)


def split_records(records: list[RestoredRecord]) -> tuple[list[RestoredRecord], dict[str, RestoredRecord]]:
    """Restored records: the heads (JSON), and the chunks by key."""
    heads = [r for r in records if r.data[:1] == b"{"]
    chunks = {r.key: r for r in records if r.data[:1] != b"{"}
    return heads, chunks


def read_episode(
    r: RestoredRecord,
    chunks: dict[str, RestoredRecord],
    agent: str,
    boundary_model: type[Boundary],
    share: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Episode:
    """One episode of ``agent`` (attempt + 1) from its head record and the chunks it names (taken from ``chunks``);
    its task row passed through ``share`` (:class:`~.shared_params.SharedParams`)."""
    try:
        version = json.loads(r.data).get("schema_version")
    except (ValueError, AttributeError):
        raise InvalidState(f"record {r.key} is not an agent episode: not a JSON object") from None
    model: type[EpisodeRecord | EpisodeHead] = EpisodeRecord if version == 1 else EpisodeHead
    try:
        record = model.model_validate_json(r.data)
    except ValidationError as exc:
        raise InvalidState(f"record {r.key} is not an agent episode: {_first_error(exc)}") from None
    if record.agent != agent:
        raise InvalidState(f"record {r.key} belongs to agent {record.agent!r}, this is {agent!r}")
    if (
        record.rollout_id != r.rollout_id
        or record.attempt != r.attempt
        or r.key != episode_record_key(record.rollout_id)
    ):
        raise InvalidState(f"record {r.key} does not match its manifest entry (rollout id, attempt or key)")
    tokens = EpisodeTokens()
    log = EpisodeLog()
    data: dict[str, Any] = record.boundary if isinstance(record, EpisodeRecord) else {}
    if isinstance(record, EpisodeHead):
        stored = []
        for i in range(record.chunks):
            chunk = chunks.pop(episode_chunk_key(r.key, i), None)
            if chunk is None:
                raise InvalidState(f"record {r.key}: its chunk {episode_chunk_key(r.key, i)} is missing")
            if (chunk.rollout_id, chunk.attempt) != (r.rollout_id, r.attempt):
                raise InvalidState(f"record {chunk.key}: manifest identity does not match its head's")
            stored.append(chunk.data)
        try:
            data = decode_chunks(stored, tokens)
        except (ValueError, TokenCodecError) as exc:
            raise InvalidState(f"record {r.key}: its chunks do not read: {exc}") from None
    if share is not None and isinstance(data.get("row"), dict):
        data = {**data, "row": share(data["row"])}
    try:
        boundary = boundary_model.model_validate(data)
    except ValidationError as exc:
        raise InvalidState(f"record {r.key} holds an invalid boundary: {_first_error(exc)}") from None
    if isinstance(record, EpisodeHead):
        log = restored_log(stored, boundary, tokens)
    return Episode(record.rollout_id, record.attempt + 1, boundary, restored=True, tokens=tokens, log=log)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
