"""The stored documents read back: manifests (both participant manifest versions), claims, tombstones, restore
decisions and reuse intents, parsed and checked; the packed manifest's codec; the one digest every object is
verified by.

The bottom of the storage core: :mod:`.store` parses what it reads here, :mod:`.packs` encodes the manifest it
writes here, :mod:`.records` and :mod:`.retention` tell manifest versions apart here. This module imports none of
them. A document that cannot be parsed is :class:`~gym_services.control.participant.InvalidState` (never guess what a
damaged checkpoint holds). The formats: ``docs/protocol.md``, "Records and manifests".
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from gym_services.control import layout
from gym_services.control.models import (
    PACKED_SCHEMA_VERSION,
    SCHEMA_VERSION,
    CheckpointClaim,
    GlobalManifest,
    PackedManifest,
    PackEntry,
    ParticipantManifest,
    RestoreDecision,
    ReuseIntent,
    Tombstone,
)
from gym_services.control.participant import InvalidState

GZIP_MAGIC = b"\x1f\x8b"
M = TypeVar("M", bound=BaseModel)


def sha256_hex(data: bytes) -> str:
    """The digest manifests record of every object they list, and the coordinator of every participant manifest."""
    return hashlib.sha256(data).hexdigest()


def _json_object(data: bytes, what: str) -> dict[str, object]:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"{what} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidState(f"{what} must be a JSON object")
    return raw


def _validated(model: type[M], raw: object, what: str) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"{what} is malformed: {exc.errors(include_url=False)[:3]}") from None


def parse_global_manifest(data: bytes) -> GlobalManifest:
    raw = _json_object(data, "checkpoint manifest")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidState("checkpoint manifest has an unsupported schema_version")
    return _validated(GlobalManifest, raw, "checkpoint manifest")


def is_packed(data: bytes) -> bool:
    """A packed participant manifest (gzip) rather than a version 1 one (plain JSON)."""
    return data[:2] == GZIP_MAGIC


def parse_participant_manifest(data: bytes) -> ParticipantManifest | PackedManifest:
    """Either version: a packed manifest (gzip), or a plain one (version 1, read only)."""
    if is_packed(data):
        return parse_packed_manifest(data)
    raw = _json_object(data, "participant manifest")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidState(
            f"participant manifest schema_version {raw.get('schema_version')!r} is not supported "
            f"(want {SCHEMA_VERSION})"
        )
    return _validated(ParticipantManifest, raw, "participant manifest")


def encode_packed_manifest(manifest: PackedManifest) -> bytes:
    """The stored bytes of a packed manifest: gzip-compressed JSON, the same bytes for the same manifest."""
    return gzip.compress(manifest.model_dump_json().encode(), compresslevel=6, mtime=0)


def parse_packed_manifest(data: bytes) -> PackedManifest:
    try:
        raw = json.loads(gzip.decompress(data))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"packed participant manifest is not gzip-compressed JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != PACKED_SCHEMA_VERSION:
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        raise InvalidState(f"packed participant manifest schema_version {version!r} is not supported")
    return _validated(PackedManifest, raw, "packed participant manifest")


def manifest_records(manifest: ParticipantManifest | PackedManifest) -> int:
    """How many records a participant manifest lists."""
    return len(manifest.records.keys) if isinstance(manifest, PackedManifest) else len(manifest.records)


def references(packs: Iterable[PackEntry], checkpoint_id: str) -> list[str]:
    """The earlier checkpoints whose packs a manifest of ``checkpoint_id`` lists (deletion keeps them readable)."""
    return sorted({owner for p in packs if (owner := layout.checkpoint_of(p.key)) and owner != checkpoint_id})


def parse_claim(data: bytes) -> CheckpointClaim:
    try:
        return CheckpointClaim.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidState(f"checkpoint claim is malformed: {exc.errors(include_url=False)[:3]}") from None


def parse_tombstone(data: bytes, checkpoint_id: str) -> Tombstone:
    try:
        return Tombstone.model_validate_json(data)
    except ValidationError:
        raise InvalidState(f"checkpoint {checkpoint_id}'s tombstone is malformed") from None


def parse_reuse_intent(data: bytes, checkpoint_id: str) -> ReuseIntent:
    try:
        return ReuseIntent.model_validate_json(data)
    except ValidationError:
        raise InvalidState(f"a reuse intent is malformed; cannot tell what {checkpoint_id} will read") from None


def parse_decision(data: bytes, checkpoint_id: str, restore_id: str) -> RestoreDecision:
    """One restore's decision, checked against where it was found (another restore's is refused)."""
    what = f"restore decision {restore_id} of checkpoint {checkpoint_id}"
    try:
        decided = RestoreDecision.model_validate(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
        raise InvalidState(f"{what} is malformed: {exc}") from None
    if decided.schema_version != SCHEMA_VERSION or (decided.checkpoint_id, decided.restore_id) != (
        checkpoint_id,
        restore_id,
    ):
        raise InvalidState(f"{what} does not match its key")
    return decided
