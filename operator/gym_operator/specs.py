"""Checkpoint, Restore and CheckpointSchedule specs, and the operator's own settings, parsed once with every default.

The controllers (:mod:`gym_operator.controllers`) parse a resource's ``spec`` with
:meth:`CheckpointSpec.parse` / :meth:`RestoreSpec.parse` and read only these models: every
default (pause lease, prepare timeout, storage location, selector) is filled here, from the
protocol's defaults (:mod:`gym_services.control.protocol`) and from :class:`OperatorSettings`.
Field names follow the CRDs (``charts/gym-checkpoint/crds/``); the API server has already
checked their schemas, so a spec failing here is a bug or a hand-edited object, and ends the
resource in ``Failed`` with reason ``InvalidSpec``.
"""

from __future__ import annotations

import datetime as dt
import enum
import os
import re
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gym_services.control.protocol import DEFAULT_LEASE_S, DEFAULT_PREPARE_TIMEOUT_S, CheckpointMethod


class SpecError(ValueError):
    """A spec that does not parse; the message names the field."""


class _Spec(BaseModel):
    """camelCase on the wire, snake_case in Python; fields the CRD does not define are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | None) -> Self:
        try:
            return cls.model_validate(dict(spec or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
            )
            raise SpecError(f"invalid {cls.__name__}: {problems}") from None


#: a label key (an optional DNS-subdomain prefix and '/', then a name) and a label value, as Kubernetes validates them
#: (the CRDs check the same; a spec failing here was written around them)
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_key(key: str) -> str:
    if len(key) > 317 or not LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a label key")
    return key


def label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a label value")
    return value


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class SelectorRequirement(_Spec):
    """One ``matchExpressions`` entry, as in a Kubernetes LabelSelector."""

    key: str = Field(min_length=1)
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list)

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return label_key(key)

    @field_validator("values")
    @classmethod
    def _values(cls, values: list[str]) -> list[str]:
        return [label_value(v) for v in values]

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> SelectorRequirement:
        takes_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if takes_values and not self.values:
            raise ValueError(f"{self.operator} needs values")
        if not takes_values and self.values:
            raise ValueError(f"{self.operator} takes no values")
        return self

    def requirement(self) -> str:
        """The label-selector string form (``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``)."""
        if self.operator is SelectorOperator.EXISTS:
            return self.key
        if self.operator is SelectorOperator.DOES_NOT_EXIST:
            return f"!{self.key}"
        word = "in" if self.operator is SelectorOperator.IN else "notin"
        return f"{self.key} {word} ({','.join(sorted(self.values))})"


class SelectorSpec(_Spec):
    """The stack's pods: ``matchLabels`` and ``matchExpressions`` (both must hold), as a LabelSelector."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[SelectorRequirement] = Field(default_factory=list)

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return {label_key(k): label_value(v) for k, v in labels.items()}

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class DeletionPolicy(enum.StrEnum):
    """What deleting a Checkpoint (by hand, or when its ``ttl`` runs out) does to its stored objects."""

    RETAIN = "Retain"  # the objects stay (restorable by location and checkpoint id)
    DELETE = "Delete"  # the objects are removed (never while a Restore reads them)


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> dt.timedelta:
    """``24h``, ``1h30m``, ``90s``, ``0s``: hours, minutes and seconds, each optional, in that order."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration like 24h, 1h30m or 90s")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return dt.timedelta(hours=hours, minutes=minutes, seconds=seconds)


DEFAULT_LOCATION = "default"
#: the label a location resource answers to besides its name (the chart's: its values' name, ``default`` for the
#: release's own location), so that two releases in one namespace each have their ``default``
LOCATION_LABEL = "gym-checkpoint.dev/location"


class Provider(enum.StrEnum):
    S3 = "s3"
    FILE = "file"


class AccessMode(enum.StrEnum):
    READ_WRITE = "ReadWrite"
    READ_ONLY = "ReadOnly"  # restored from, never written: a Checkpoint naming it is refused


class CredentialRef(_Spec):
    """The Secret (in the location's namespace) holding ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``: read by
    the operator alone, never sent to a server."""

    name: str = Field(min_length=1)


class LocationSpec(_Spec):
    """A ``CheckpointStorageLocation``'s spec (``charts/gym-checkpoint/crds/storagelocations.yaml``)."""

    release: str = Field(min_length=1)
    provider: Provider = Provider.S3
    bucket: str | None = None
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    credential: CredentialRef | None = None
    access_mode: AccessMode = AccessMode.READ_WRITE
    validation_frequency: dt.timedelta = dt.timedelta(minutes=1)

    @field_validator("validation_frequency", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _where(self) -> LocationSpec:
        if self.provider is Provider.S3 and not self.bucket:
            raise ValueError("provider s3 needs a bucket")
        if self.provider is Provider.FILE and not self.prefix.startswith("/"):
            raise ValueError("provider file needs prefix: an absolute path")
        return self

    @property
    def url(self) -> str:
        prefix = self.prefix.strip("/")
        if self.provider is Provider.FILE:
            return f"file:///{prefix}"
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"


class StorageLocation(BaseModel):
    """A storage location as the operator reaches it: a ``CheckpointStorageLocation`` of the release (``resource``
    its name), or the operator's own default (``GYMCKPT_STORAGE``: an operator run without the chart). A Checkpoint
    or Restore names one; it sets nothing of it."""

    model_config = ConfigDict(frozen=True)

    name: str
    url: str = Field(min_length=1, description="s3://bucket/prefix or file:///path")
    endpoint: str | None = None
    region: str | None = None
    credential: str | None = Field(default=None, description="Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY")
    access_mode: AccessMode = AccessMode.READ_WRITE
    resource: str | None = Field(default=None, description="the CheckpointStorageLocation, None for GYMCKPT_STORAGE")
    #: the location's last validation said Unavailable: why (None: Available, or not validated yet)
    unavailable: str | None = None

    @property
    def read_only(self) -> bool:
        return self.access_mode is AccessMode.READ_ONLY

    @classmethod
    def of(cls, resource: Mapping[str, Any]) -> StorageLocation:
        """From a ``CheckpointStorageLocation`` object; :class:`SpecError` when its spec is invalid."""
        spec = LocationSpec.parse(resource.get("spec"))
        meta, status = resource.get("metadata") or {}, resource.get("status") or {}
        return cls(
            name=meta["name"],
            url=spec.url,
            endpoint=spec.endpoint,
            region=spec.region,
            credential=spec.credential.name if spec.credential else None,
            access_mode=spec.access_mode,
            resource=meta["name"],
            unavailable=(status.get("message") or "unavailable") if status.get("phase") == "Unavailable" else None,
        )


class CheckpointSpec(_Spec):
    #: the Helm release whose operator runs it (the operators of other releases ignore it)
    release: str = Field(min_length=1)
    selector: SelectorSpec = Field(default_factory=SelectorSpec)
    storage_location: str = DEFAULT_LOCATION
    prepare_timeout_seconds: float = Field(default=DEFAULT_PREPARE_TIMEOUT_S, gt=0)
    lease_seconds: float = Field(default=DEFAULT_LEASE_S, gt=0)
    method: CheckpointMethod = CheckpointMethod.BACKGROUND
    #: how long the Checkpoint lives after its creation; then the operator deletes it (None: until deleted)
    ttl: dt.timedelta | None = None
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    #: a termination checkpoint (``docs/protocol.md``, "Termination"): persisted and published under the pause, and
    #: the participants are never resumed (their pods are going away; the others exit and come back fresh)
    final: bool = False
    #: when the transaction must be published by; not published then, it is aborted (None: no deadline)
    deadline: dt.datetime | None = None

    @field_validator("ttl", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("deadline")
    @classmethod
    def _aware(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("a deadline needs its time zone (RFC 3339, e.g. 2026-01-01T12:00:00Z)")
        return value


class CheckpointRefSpec(_Spec):
    name: str = Field(min_length=1)


class RestoreSpec(_Spec):
    """A Checkpoint by name, or a checkpoint id in a storage location (the CRD allows exactly one of the two)."""

    #: the Helm release whose operator runs it, from a Checkpoint of the same release
    release: str = Field(min_length=1)
    checkpoint_ref: CheckpointRefSpec | None = None
    storage_location: str = DEFAULT_LOCATION
    checkpoint_id: str | None = None
    selector: SelectorSpec = Field(default_factory=SelectorSpec)
    lease_seconds: float = Field(default=DEFAULT_LEASE_S, gt=0)


#: the fields of a Checkpoint's spec a CheckpointSchedule's template may set (the rest belong to the schedule or
#: to the operator: release, final, deadline)
TEMPLATE_FIELDS = (
    "selector",
    "storageLocation",
    "prepareTimeoutSeconds",
    "leaseSeconds",
    "method",
    "ttl",
    "deletionPolicy",
)


class ScheduleSpec(_Spec):
    """A CheckpointSchedule (Velero's Schedule): when (:mod:`gym_operator.cron`), how many to keep, the Checkpoint
    spec each run stamps out."""

    release: str = Field(min_length=1)
    #: a 5-field cron expression, a descriptor (@daily) or ``@every <duration>``; parsed by the controller
    schedule: str = Field(min_length=1)
    keep: int = Field(default=5, ge=1)
    paused: bool = False
    template: dict[str, Any] = Field(default_factory=dict)

    def checkpoint(self) -> CheckpointSpec:
        """The spec of the Checkpoints this schedule creates (:class:`SpecError` when the template is invalid)."""
        unknown = sorted(set(self.template) - set(TEMPLATE_FIELDS))
        if unknown:
            raise SpecError(f"spec.template.{unknown[0]}: not a field a schedule's Checkpoints take")
        return CheckpointSpec.parse({**self.template, "release": self.release})


class OperatorSettings(BaseModel):
    """The operator's configuration, from its environment (the Helm chart sets it), read once at startup."""

    model_config = ConfigDict(frozen=True)

    token: str = Field(min_length=1, description="GYMCKPT_CONTROL_TOKEN: the Secret shared with the servers")
    default_location: str | None = Field(
        default=None,
        description="GYMCKPT_STORAGE: the location `default` names when the release has no CheckpointStorageLocation "
        "labelled gym-checkpoint.dev/location=default (an operator run without the chart; the chart renders that "
        "resource instead)",
    )
    gateway_key: SecretStr | None = Field(
        default=None,
        description="GYMCKPT_GATEWAY_KEY: signs the storage grants the servers present to the operator's storage "
        "gateway; unset, no grant is sent and each server reaches storage with its own config",
    )
    release: str = Field(
        min_length=1,
        max_length=53,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="GYMCKPT_RELEASE: the Helm release (a DNS label of at most 53 characters, as Helm's release "
        "names); the operator runs only Checkpoints and Restores whose "
        "spec.release is this, and selects the pods labelled app.kubernetes.io/instance=<release>",
    )
    selector: str | None = Field(default=None, description="GYMCKPT_PARTICIPANT_SELECTOR: default label selector")
    scanning_disabled: bool = Field(default=False, description="GYMCKPT_KOPF_SCANNING=disabled (namespaced RBAC)")
    endpoint_url: str | None = Field(default=None, description="AWS_ENDPOINT_URL: S3 endpoint when a spec names none")
    region: str | None = Field(default=None, description="AWS_REGION: S3 region when a spec names none")
    deployment: str | None = Field(
        default=None,
        description="GYMCKPT_OPERATOR_DEPLOYMENT: the operator's own Deployment; when it is gone (helm uninstall) or "
        "the namespace is terminating, the operator releases its finalizers as it stops",
    )
    delete_tries: int = Field(
        default=6,
        ge=1,
        description="GYMCKPT_DELETE_ATTEMPTS: tries to delete a deleted Checkpoint's data (deletionPolicy: Delete) "
        "before the operator keeps the data, says so in one Warning Event, and lets the Checkpoint go",
    )
    delete_retry_s: float = Field(
        default=10.0, gt=0, description="GYMCKPT_DELETE_RETRY_SECONDS: first delay between those tries (then doubled)"
    )
    watch_timeout_s: float = Field(
        default=60.0, ge=5, description="GYMCKPT_WATCH_TIMEOUT_SECONDS: the API server ends each watch this often"
    )
    rollout_patience_s: float = Field(
        default=600.0,
        gt=0,
        description="GYMCKPT_ROLLOUT_PATIENCE_SECONDS: how long a transaction waits for the stack's pods to settle",
    )
    auto_restore: bool = Field(
        default=False,
        description="GYMCKPT_AUTO_RESTORE=enabled (the chart's autoRestore): when the participants come back fresh "
        "after a termination checkpoint or a crash, restore the newest complete checkpoint",
    )
    termination_checkpoint: bool = Field(
        default=False,
        description="GYMCKPT_TERMINATION_CHECKPOINT=enabled (the chart's termination.checkpoint): a pod of the release "
        "that is being deleted, or has the DisruptionTarget condition, starts a final Checkpoint of the whole stack",
    )
    termination_margin_s: float = Field(
        default=10.0,
        ge=0,
        description="GYMCKPT_TERMINATION_MARGIN_SECONDS: a termination checkpoint must be published this long before "
        "the terminating pod's grace period ends (the servers hold their state until then)",
    )
    termination_lease_s: float = Field(
        default=15.0,
        ge=5,
        description="GYMCKPT_TERMINATION_LEASE_SECONDS: the pause lease of a termination checkpoint; the participants "
        "whose pods are not going away exit this long after it is published, and come back fresh",
    )
    #: a checkpoint's control calls may take its prepare timeout plus this
    call_margin_s: float = 30.0
    #: a restore's control calls (besides restore itself, see the coordinator's deadlines) may take this long
    restore_call_timeout_s: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        if not env.get("GYMCKPT_CONTROL_TOKEN"):
            raise SpecError("GYMCKPT_CONTROL_TOKEN is not set: the operator cannot call control routes")
        if not env.get("GYMCKPT_RELEASE"):
            raise SpecError(
                "GYMCKPT_RELEASE is not set: the operator must know which release's Checkpoints and Restores it runs"
            )
        if env.get("GYMCKPT_STORAGE_LOCATIONS"):
            raise SpecError(
                "GYMCKPT_STORAGE_LOCATIONS is no longer read: storage locations are CheckpointStorageLocation "
                "resources (the chart renders one per storage.locations entry; docs/operations/guide.md, Storage "
                "locations)"
            )
        if env.get("GYMCKPT_GATEWAY_KEY") and len(env["GYMCKPT_GATEWAY_KEY"]) < 16:
            raise SpecError("GYMCKPT_GATEWAY_KEY needs at least 16 characters")
        try:
            tries = int(env.get("GYMCKPT_DELETE_ATTEMPTS") or 6)
            retry_s = float(env.get("GYMCKPT_DELETE_RETRY_SECONDS") or 10.0)
        except ValueError as exc:
            raise SpecError(f"GYMCKPT_DELETE_ATTEMPTS / GYMCKPT_DELETE_RETRY_SECONDS: {exc}") from None
        try:
            return cls._from(env, tries, retry_s)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            raise SpecError(f"invalid operator settings: {problems}") from None

    @classmethod
    def _from(cls, env: Mapping[str, str], tries: int, retry_s: float) -> OperatorSettings:
        return cls(
            deployment=env.get("GYMCKPT_OPERATOR_DEPLOYMENT") or None,
            delete_tries=tries,
            delete_retry_s=retry_s,
            token=env["GYMCKPT_CONTROL_TOKEN"],
            default_location=env.get("GYMCKPT_STORAGE") or None,
            gateway_key=env.get("GYMCKPT_GATEWAY_KEY") or None,
            release=env["GYMCKPT_RELEASE"],
            selector=env.get("GYMCKPT_PARTICIPANT_SELECTOR") or None,
            scanning_disabled=env.get("GYMCKPT_KOPF_SCANNING", "") == "disabled",
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or None,
            auto_restore=env.get("GYMCKPT_AUTO_RESTORE", "") == "enabled",
            termination_checkpoint=env.get("GYMCKPT_TERMINATION_CHECKPOINT", "") == "enabled",
            **{
                field: env[name]
                for field, name in (
                    ("watch_timeout_s", "GYMCKPT_WATCH_TIMEOUT_SECONDS"),
                    ("rollout_patience_s", "GYMCKPT_ROLLOUT_PATIENCE_SECONDS"),
                    ("termination_margin_s", "GYMCKPT_TERMINATION_MARGIN_SECONDS"),
                    ("termination_lease_s", "GYMCKPT_TERMINATION_LEASE_SECONDS"),
                )
                if env.get(name)
            },
        )

    def checkpoint_call_timeout(self, spec: CheckpointSpec) -> float:
        return spec.prepare_timeout_seconds + self.call_margin_s
