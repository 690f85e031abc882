"""The installed CRDs against this operator, checked once at startup.

Helm installs a chart's ``crds/`` once and never upgrades them, so after ``helm upgrade`` the operator may run over
CRDs of an older chart: the API server would then prune every spec field the old schema lacks, and a Checkpoint
would silently lose, say, its ``storageLocation``. The operator reads the installed schema from the API server's
OpenAPI v3 document of the group-version, which every authenticated client may read (the ``system:discovery``
role), so neither the operator nor whoever deploys the chart needs a cluster-wide right to get CRDs; and it refuses
to start while a spec field it reads is missing, naming the command that updates the CRDs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
from pydantic import BaseModel

from gym_operator.kube import Kube, KubeError, Unavailable
from gym_operator.specs import CheckpointSpec, RestoreSpec, ScheduleSpec

GROUP_VERSION = "gym-checkpoint.dev/v1alpha1"
KINDS: dict[str, type[BaseModel]] = {
    "Checkpoint": CheckpointSpec,
    "Restore": RestoreSpec,
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
        f"the installed gym-checkpoint.dev CRDs are older than this operator ({what}): Helm never upgrades CRDs, "
        f"so apply the chart's: {UPDATE} (or set crds.checkVersion=false to run anyway)"
    )


async def verify(kube: Kube) -> None:
    """Raise kopf.PermanentError (the operator stops) when the installed CRDs lack a field this operator reads.
    An API server that does not answer raises Unavailable (kopf retries the startup); one that hides its OpenAPI
    document from this service account (401, 403, 404) leaves the CRDs unchecked, with a warning."""
    if not enabled():
        log.info("crds.checkVersion is off: the installed CRDs are not checked")
        return
    try:
        document = await kube.openapi_document(GROUP_VERSION)
    except Unavailable:
        raise
    except KubeError as exc:
        log.warning("cannot read the installed CRDs' schema (%s): running without checking them", exc)
        return
    missing = missing_spec_fields(document)
    if missing:
        raise kopf.PermanentError(stale_message(missing))
