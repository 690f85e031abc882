"""What a backup tool finds (Velero): a Checkpoint or Restore is a transaction, not state to back up and replay.

- Every Checkpoint and Restore of the release carries ``velero.io/exclude-from-backup: "true"`` (the operator puts it
  on when it first sees one): a Velero backup of the namespace leaves them out. The checkpoints themselves are in
  the storage location; the catalog of the stored ones is rebuilt from there.
- One that a Velero restore re-created anyway (an older backup, or the label removed: Velero labels what it restores
  ``velero.io/restore-name``) never runs: a re-created Restore would put the stack back to an old checkpoint, a
  re-created Checkpoint would take one nobody asked for. Without a final status it ends ``Failed`` (reason
  ``RestoredByVelero``); with one (a status restored with it) the operator leaves it as it is, as every ended
  transaction (its daemon never starts).

``docs/operations/guide.md`` ("Backups with Velero") says the same to the admin.
"""

from __future__ import annotations

import logging
from typing import Any

from gym_operator.controllers.context import Context
from gym_operator.kube import KubeError

log = logging.getLogger("gym.operator")

EXCLUDE = "velero.io/exclude-from-backup"
#: the label Velero puts on every object it restores (its value: the Velero Restore's name)
RESTORED_BY = "velero.io/restore-name"


def restored_by_velero(body: Any) -> str | None:
    """The Velero restore that re-created this resource, if one did."""
    value = ((body.get("metadata") or {}).get("labels") or {}).get(RESTORED_BY)
    return str(value) if value else None


async def exclude(context: Context, plural: str, body: Any) -> None:
    """Label a resource of the release ``velero.io/exclude-from-backup`` unless it is already (one patch, once; a
    failure is left for its next watch event)."""
    meta = body.get("metadata") or {}
    if (meta.get("labels") or {}).get(EXCLUDE) == "true" or meta.get("deletionTimestamp"):
        return
    try:
        context.fence()
        await context.kube.patch_labels(plural, str(meta.get("namespace")), str(meta.get("name")), {EXCLUDE: "true"})
    except KubeError as exc:
        log.info(f"{plural}/{meta.get('name')}: not labelled {EXCLUDE} yet ({exc})")
