"""The installed CRDs against this operator, checked by every replica before it competes for the leadership, and
again now and then (:mod:`gym_operator.main`).

Helm installs a chart's ``crds/`` once and never upgrades them (the chart's pre-upgrade hook does:
:mod:`gym_operator.crdupgrade`), so after ``helm upgrade`` the operator may run over CRDs of an older chart: the API
server would then prune every spec field the old schema lacks, and a Checkpoint would silently lose, say, its
``storageLocation``. The operator reads the installed schema from the API server's OpenAPI v3 document of the
group-version, which every authenticated client may read (the ``system:discovery`` role), so neither the operator
nor whoever deploys the chart needs a cluster-wide right to get CRDs. A replica that finds a spec field it reads
missing does not lead, and its readiness probe says why (naming the command that updates the CRDs): the rollout of
new operator pods stops there, the old ones keep working, and nothing crash-loops.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pydantic import BaseModel

from gym_operator.kube import Kube, KubeError, Unavailable
from gym_operator.specs import CheckpointSpec, LocationSpec, RestoreSpec, ScheduleSpec

GROUP_VERSION = "gym-checkpoint.dev/v1alpha1"
KINDS: dict[str, type[BaseModel]] = {
    "Checkpoint": CheckpointSpec,
    "Restore": RestoreSpec,
    "CheckpointStorageLocation": LocationSpec,
    "CheckpointSchedule": ScheduleSpec,
}
UPDATE = "kubectl apply --server-side --force-conflicts -f charts/gym-checkpoint/crds/"
#: the chart's switch (crds.checkVersion): "disabled" skips the check
ENV = "GYMCKPT_CRD_CHECK"

log = logging.getLogger("gym.operator")


def enabled() -> bool:
    return os.environ.get(ENV, "enabled") != "disabled"


def spec_fields(model: type[BaseModel]) -> list[str]:
    """The spec fields the operator reads, as the CRD names them (camelCase)."""
    return sorted(field.alias or name for name, field in model.model_fields.items())


def missing_spec_fields(document: dict[str, Any]) -> dict[str, list[str]]:
    """Kind -> the spec fields this operator reads that the installed schema (an OpenAPI v3 document of
    ``GROUP_VERSION``) lacks; a kind the document does not have at all lacks every field."""
    schemas = (document.get("components") or {}).get("schemas") or {}
    prefix = ".".join(reversed(GROUP_VERSION.split("/")[0].split("."))) + "." + GROUP_VERSION.split("/")[1]
    missing = {}
    for kind, model in KINDS.items():
        schema = schemas.get(f"{prefix}.{kind}") or {}
        have = set(((schema.get("properties") or {}).get("spec") or {}).get("properties") or {})
        lacking = [name for name in spec_fields(model) if name not in have]
        if lacking:
            missing[kind] = lacking
    return missing


def stale_message(missing: dict[str, list[str]]) -> str:
    what = "; ".join(f"{kind} has no spec.{', spec.'.join(fields)}" for kind, fields in sorted(missing.items()))
    return (
        f"the installed gym-checkpoint.dev CRDs are older than this operator ({what}): Helm never upgrades CRDs "
        f"(the chart's pre-upgrade hook does, with crds.upgrade), so apply the chart's: {UPDATE} (or set "
        "crds.checkVersion=false to run anyway)"
    )


async def problem(kube: Kube) -> str | None:
    """Why this operator must not run over the installed CRDs; None when they have every spec field it reads (or
    the check is off, or this service account may not read the OpenAPI document: said in a warning). Raises
    :class:`Unavailable` when the API server does not answer."""
    if not enabled():
        return None
    try:
        document = await kube.openapi_document(GROUP_VERSION)
    except Unavailable:
        raise
    except KubeError as exc:
        log.warning("cannot read the installed CRDs' schema (%s): running without checking them", exc)
        return None
    missing = missing_spec_fields(document)
    return stale_message(missing) if missing else None
