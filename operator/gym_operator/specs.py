"""Checkpoint and Restore specs, and the operator's own settings, parsed once with every default.

The kopf handlers (:mod:`gym_operator.handlers`) parse a resource's ``spec`` with
:meth:`CheckpointSpec.parse` / :meth:`RestoreSpec.parse` and read only these models: every
default (lease, prepare timeout, storage location, selector) is filled here, from the
protocol's defaults (:mod:`gym_services.control.protocol`) and from :class:`OperatorSettings`.
Field names follow the CRDs (``charts/gym-checkpoint/crds/``); the API server has already
checked their schemas, so a spec failing here is a bug or a hand-edited object, and ends the
resource in ``Failed`` with reason ``InvalidSpec``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gym_services.control.protocol import DEFAULT_LEASE_S, DEFAULT_PREPARE_TIMEOUT_S, CheckpointMethod


class SpecError(ValueError):
    """A spec that does not parse; the message names the field."""


class _Spec(BaseModel):
    """camelCase on the wire, snake_case in Python; fields the CRD does not define are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | None):
        try:
            return cls.model_validate(dict(spec or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
            )
            raise SpecError(f"invalid {cls.__name__}: {problems}") from None


class SelectorSpec(_Spec):
    match_labels: dict[str, str] = Field(default_factory=dict)


class StorageSpec(_Spec):
    """Where records go and how to reach it; what is set here is also sent to every server."""

    location: str | None = None
    endpoint: str | None = None
    region: str | None = None
    credentials_secret: str | None = None

    def over(self, base: StorageSpec) -> StorageSpec:
        """These settings, with ``base``'s where these name none (a Restore over its Checkpoint's)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class CheckpointSpec(_Spec):
    selector: SelectorSpec = Field(default_factory=SelectorSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    prepare_timeout_seconds: float = Field(default=DEFAULT_PREPARE_TIMEOUT_S, gt=0)
    lease_seconds: float = Field(default=DEFAULT_LEASE_S, gt=0)
    method: CheckpointMethod = CheckpointMethod.SNAPSHOT


class CheckpointRefSpec(_Spec):
    name: str = Field(min_length=1)


class RestoreSpec(_Spec):
    """A Checkpoint by name, or a location and checkpoint id (the CRD allows exactly one of the two)."""

    checkpoint_ref: CheckpointRefSpec | None = None
    location: str | None = None
    checkpoint_id: str | None = None
    selector: SelectorSpec = Field(default_factory=SelectorSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    lease_seconds: float = Field(default=DEFAULT_LEASE_S, gt=0)


class OperatorSettings(BaseModel):
    """The operator's configuration, from its environment (the Helm chart sets it), read once at startup."""

    model_config = ConfigDict(frozen=True)

    token: str = Field(min_length=1, description="GYMCKPT_CONTROL_TOKEN: the Secret shared with the servers")
    default_location: str | None = Field(default=None, description="GYMCKPT_STORAGE: location when a spec names none")
    release: str | None = Field(default=None, description="GYMCKPT_RELEASE: default selector instance label")
    selector: str | None = Field(default=None, description="GYMCKPT_PARTICIPANT_SELECTOR: default label selector")
    scanning_disabled: bool = Field(default=False, description="GYMCKPT_KOPF_SCANNING=disabled (namespaced RBAC)")
    endpoint_url: str | None = Field(default=None, description="AWS_ENDPOINT_URL: S3 endpoint when a spec names none")
    region: str | None = Field(default=None, description="AWS_REGION: S3 region when a spec names none")
    #: a checkpoint's control calls may take its prepare timeout plus this
    call_margin_s: float = 30.0
    #: a restore's control calls (besides restore itself, see the coordinator's deadlines) may take this long
    restore_call_timeout_s: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        if not env.get("GYMCKPT_CONTROL_TOKEN"):
            raise SpecError("GYMCKPT_CONTROL_TOKEN is not set: the operator cannot call control routes")
        return cls(
            token=env["GYMCKPT_CONTROL_TOKEN"],
            default_location=env.get("GYMCKPT_STORAGE") or None,
            release=env.get("GYMCKPT_RELEASE") or None,
            selector=env.get("GYMCKPT_PARTICIPANT_SELECTOR") or None,
            scanning_disabled=env.get("GYMCKPT_KOPF_SCANNING", "") == "disabled",
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or None,
        )

    def checkpoint_call_timeout(self, spec: CheckpointSpec) -> float:
        return spec.prepare_timeout_seconds + self.call_margin_s
