"""Where checkpoint objects live under a location: the only module that builds or takes apart a storage key.

``docs/protocol.md``, "Records and manifests", describes the layout. The storage core uses it: the store
(:mod:`.store`, which reads and writes every object), retention (:mod:`.retention`, which removes them) and
the stored documents' helpers (:mod:`.manifests`). Everyone else names checkpoints, participants and restores,
and the store turns those names into keys here (``tests/services/control/test_store_owns_the_layout.py``).

Every checkpoint's objects lie under ``checkpoints/<checkpoint id>/``::

    manifest.json                              the global manifest (its presence is the checkpoint)
    claim.json                                 the one transaction the id names
    tombstone.json                             deleted, failed or abandoned: never published (again)
    restores/<restore id>.json                 one restore's decision
    participants/<participant id>/manifest.json  a participant manifest (packed, or version 1)
    participants/<participant id>/reuses.json    the packs of earlier checkpoints it will reference
    participants/<participant id>/packs/<n>.pack the packed format's packs
    participants/<participant id>/records/<key>  version 1: one object per record (read only)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: the folder every checkpoint's objects are under
CHECKPOINTS = "checkpoints"
_MANIFEST = "manifest.json"
_REUSES = "reuses.json"
#: a pack's key (:func:`pack_key`): always under some checkpoint's participant folder; a packed manifest lists no
#: other object (``PackEntry`` in :mod:`.models` checks it)
PACK_KEY_PATTERN = (
    r"^checkpoints/[A-Za-z0-9][A-Za-z0-9._-]{0,127}/participants/[A-Za-z0-9][A-Za-z0-9._=-]*/packs/[0-9]{5}\.pack$"
)


def checkpoint_prefix(checkpoint_id: str) -> str:
    return f"{CHECKPOINTS}/{checkpoint_id}"


def participant_prefix(checkpoint_id: str, participant_id: str) -> str:
    return f"{checkpoint_prefix(checkpoint_id)}/participants/{participant_id}"


def participants_prefix(checkpoint_id: str) -> str:
    """The folder of every participant's objects of one checkpoint."""
    return f"{checkpoint_prefix(checkpoint_id)}/participants"


def pack_key(checkpoint_id: str, participant_id: str, number: int) -> str:
    """One pack of a participant's records (the packed format)."""
    return f"{participant_prefix(checkpoint_id, participant_id)}/packs/{number:05d}.pack"


def v1_record_key(checkpoint_id: str, participant_id: str, record_key: str) -> str:
    """One record of a version 1 participant manifest: an object of its own beside the manifest (read only)."""
    return f"{participant_prefix(checkpoint_id, participant_id)}/records/{record_key}"


def reuse_intent_key(checkpoint_id: str, participant_id: str) -> str:
    """Written before a participant relies on packs of earlier checkpoints: deletion keeps what it names."""
    return f"{participant_prefix(checkpoint_id, participant_id)}/{_REUSES}"


def participant_manifest_key(checkpoint_id: str, participant_id: str) -> str:
    return f"{participant_prefix(checkpoint_id, participant_id)}/{_MANIFEST}"


def global_manifest_key(checkpoint_id: str) -> str:
    return f"{checkpoint_prefix(checkpoint_id)}/{_MANIFEST}"


def claim_key(checkpoint_id: str) -> str:
    """Written first, with a conditional put: the one transaction this checkpoint id names."""
    return f"{checkpoint_prefix(checkpoint_id)}/claim.json"


def tombstone_key(checkpoint_id: str) -> str:
    """This checkpoint id is deleted or abandoned: never published (again), its objects are being removed."""
    return f"{checkpoint_prefix(checkpoint_id)}/tombstone.json"


def restores_prefix(checkpoint_id: str) -> str:
    """The folder of a checkpoint's restore decisions."""
    return f"{checkpoint_prefix(checkpoint_id)}/restores"


def restore_decision_key(checkpoint_id: str, restore_id: str) -> str:
    """One object per restore transaction: whoever writes it first decides resume or abort."""
    return f"{restores_prefix(checkpoint_id)}/{restore_id}.json"


# --- taking keys apart -------------------------------------------------------------------


def checkpoint_of(key: str) -> str | None:
    """The checkpoint id a key lies under (``checkpoints/<id>/...``), or None."""
    parts = key.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == CHECKPOINTS else None


def participant_of_manifest(checkpoint_id: str, key: str) -> str | None:
    """The participant whose manifest of ``checkpoint_id`` is at ``key``, or None when ``key`` is not one."""
    head, _, rest = key.partition(participants_prefix(checkpoint_id) + "/")
    participant_id, _, name = rest.partition("/")
    if head or not participant_id or name != _MANIFEST:
        return None
    return participant_id if key == participant_manifest_key(checkpoint_id, participant_id) else None


def restore_id_of(key: str) -> str | None:
    """The restore a decision object's key names, or None for another key."""
    folder, _, name = key.rpartition("/")
    if not folder.endswith("/restores") or not name.endswith(".json"):
        return None
    return name[: -len(".json")]


class KeyKind(enum.StrEnum):
    """What a key of the layout is (:func:`parse_key`): the storage gateway grants by kind
    (:mod:`gym_services.control.storage.gateway`)."""

    GLOBAL_MANIFEST = "global_manifest"
    CLAIM = "claim"
    TOMBSTONE = "tombstone"
    RESTORE_DECISION = "restore_decision"
    PARTICIPANT_MANIFEST = "participant_manifest"
    REUSE_INTENT = "reuse_intent"
    PACK = "pack"
    V1_RECORD = "v1_record"


@dataclass(frozen=True)
class ParsedKey:
    """A key of the layout taken apart: its kind, its checkpoint, and its participant or restore when it has one."""

    kind: KeyKind
    checkpoint_id: str
    participant_id: str | None = None
    restore_id: str | None = None


def parse_key(key: str) -> ParsedKey | None:
    """What ``key`` is in the layout (the module docstring), or None for a key the layout never builds. The inverse
    of the builders above: ``parse_key(pack_key(c, p, 3))`` is a pack of ``c`` and ``p``."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != CHECKPOINTS or not all(parts):
        return None
    checkpoint_id, rest = parts[1], parts[2:]
    simple = {_MANIFEST: KeyKind.GLOBAL_MANIFEST, "claim.json": KeyKind.CLAIM, "tombstone.json": KeyKind.TOMBSTONE}
    if len(rest) == 1 and rest[0] in simple:
        return ParsedKey(simple[rest[0]], checkpoint_id)
    if len(rest) == 2 and rest[0] == "restores" and rest[1].endswith(".json") and len(rest[1]) > len(".json"):
        return ParsedKey(KeyKind.RESTORE_DECISION, checkpoint_id, restore_id=rest[1][: -len(".json")])
    if len(rest) < 3 or rest[0] != "participants":
        return None
    participant_id, inner = rest[1], rest[2:]
    if inner == [_MANIFEST]:
        return ParsedKey(KeyKind.PARTICIPANT_MANIFEST, checkpoint_id, participant_id)
    if inner == [_REUSES]:
        return ParsedKey(KeyKind.REUSE_INTENT, checkpoint_id, participant_id)
    if len(inner) == 2 and inner[0] == "packs" and key == pack_key_of(checkpoint_id, participant_id, inner[1]):
        return ParsedKey(KeyKind.PACK, checkpoint_id, participant_id)
    if len(inner) == 2 and inner[0] == "records":
        return ParsedKey(KeyKind.V1_RECORD, checkpoint_id, participant_id)
    return None


def pack_key_of(checkpoint_id: str, participant_id: str, name: str) -> str | None:
    """The pack key whose file name is ``name`` (``00003.pack``), or None when ``name`` is not a pack's."""
    number, dot, ext = name.partition(".")
    if dot != "." or ext != "pack" or len(number) != 5 or not number.isdigit():
        return None
    return pack_key(checkpoint_id, participant_id, int(number))


def is_reuse_intent(key: str) -> bool:
    return key.endswith(f"/{_REUSES}") and "/participants/" in key


def removal_order(checkpoint_id: str, key: str) -> int:
    """Where a key of ``checkpoint_id`` comes when its objects are removed: the global manifest first (from then on
    no restore finds the checkpoint), the participant manifests next, the claim and the tombstone last."""
    if key == global_manifest_key(checkpoint_id):
        return 0
    if key.endswith(f"/{_MANIFEST}"):
        return 1
    return 3 if key in (claim_key(checkpoint_id), tombstone_key(checkpoint_id)) else 2
