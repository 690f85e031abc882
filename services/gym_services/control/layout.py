"""Where checkpoint files live under a location (``docs/protocol.md``, "Records and manifests").

Used by whoever writes or reads them: :mod:`.records`, :mod:`.decisions`, the coordinator and the CLI.
"""

from __future__ import annotations


def checkpoint_prefix(checkpoint_id: str) -> str:
    return f"checkpoints/{checkpoint_id}"


def participant_prefix(checkpoint_id: str, participant_id: str) -> str:
    return f"{checkpoint_prefix(checkpoint_id)}/participants/{participant_id}"


def pack_key(checkpoint_id: str, participant_id: str, number: int) -> str:
    """One pack of a participant's records (the ``snapshot`` method)."""
    return f"{participant_prefix(checkpoint_id, participant_id)}/packs/{number:05d}.pack"


def checkpoint_of(key: str) -> str | None:
    """The checkpoint id a key lies under (``checkpoints/<id>/...``), or None."""
    parts = key.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "checkpoints" else None


def reuse_intent_key(checkpoint_id: str, participant_id: str) -> str:
    """Written before a participant relies on packs of earlier checkpoints: deletion keeps what it names."""
    return f"{participant_prefix(checkpoint_id, participant_id)}/reuses.json"


def participant_manifest_key(checkpoint_id: str, participant_id: str) -> str:
    return f"{participant_prefix(checkpoint_id, participant_id)}/manifest.json"


def global_manifest_key(checkpoint_id: str) -> str:
    return f"{checkpoint_prefix(checkpoint_id)}/manifest.json"


def claim_key(checkpoint_id: str) -> str:
    """Written first, with a conditional put: the one transaction this checkpoint id names."""
    return f"{checkpoint_prefix(checkpoint_id)}/claim.json"


def tombstone_key(checkpoint_id: str) -> str:
    """This checkpoint id is deleted or abandoned: never published (again), its objects are being removed."""
    return f"{checkpoint_prefix(checkpoint_id)}/tombstone.json"


def restore_decision_key(checkpoint_id: str, restore_id: str) -> str:
    """One object per restore transaction: whoever writes it first decides resume or abort."""
    return f"{checkpoint_prefix(checkpoint_id)}/restores/{restore_id}.json"
