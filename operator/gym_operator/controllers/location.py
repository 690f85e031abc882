"""Storage locations: ``CheckpointStorageLocation`` resources, as Velero's BackupStorageLocation.

- :func:`resolve`: the location a Checkpoint's or Restore's ``spec.storageLocation`` names: the release's
  ``CheckpointStorageLocation`` of that name, else the one of the release labelled ``gym-checkpoint.dev/location``
  with it (the chart's: two releases in one namespace each have their ``default``), else, for ``default``, the
  operator's ``GYMCKPT_STORAGE`` (an operator run without the chart).
- :func:`storage_config`: how the operator reaches a location: its endpoint and region, the keys of its
  ``credential`` Secret (read here, by the operator only: no server ever gets them), else the operator's own
  environment.
- :class:`Validator`: the release's locations validated every ``spec.validationFrequency`` (one cheap listing):
  ``status.phase`` Available or Unavailable with the reason, an Event at each change; a location that becomes
  Available the first time in this operator's leadership has its checkpoints synced as Checkpoint resources
  (:mod:`.catalog`). It runs as a loop of its own (not a kopf daemon: a daemon would put a finalizer on every
  location, and deleting one must never wait for the operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gym_operator.controllers.context import Context, Refused
from gym_operator.kube import KubeError
from gym_operator.specs import DEFAULT_LOCATION, LOCATION_LABEL, AccessMode, LocationSpec, SpecError, StorageLocation
from gym_operator.status import condition, now
from gym_services.base.config import StorageConfig
from gym_services.control.storage import StorageError, open_storage

log = logging.getLogger("gym.operator")

PLURAL = "checkpointstoragelocations"
#: how often the validator looks for locations that are due (new ones, changed ones, the frequency come round)
TICK_S = 2.0
#: the shortest validation period (``validationFrequency: 0s`` validates once, then only when the spec changes)
MIN_FREQUENCY_S = 5.0
#: a store that has not answered a validation in this long is Unavailable (boto3's own retries may take minutes)
VALIDATION_TIMEOUT_S = 30.0


def _ours(obj: dict[str, Any], context: Context) -> bool:
    return (obj.get("spec") or {}).get("release") == context.settings.release


async def resolve(name: str, namespace: str, context: Context) -> StorageLocation:
    """The storage location ``name`` names for this release (module docstring); :class:`Refused` otherwise."""
    kube = context.kube
    found = await kube.get_object(PLURAL, namespace, name)
    candidates = [found] if found is not None and _ours(found, context) else []
    if not candidates:
        labelled = await kube.list_objects(PLURAL, namespace, f"{LOCATION_LABEL}={name}")
        candidates = [obj for obj in labelled if _ours(obj, context)]
    if len(candidates) > 1:
        names = ", ".join(sorted(c["metadata"]["name"] for c in candidates))
        raise Refused(
            "AmbiguousStorageLocation",
            f"spec.storageLocation {name!r} matches several CheckpointStorageLocations of release "
            f"{context.settings.release} ({names}, label {LOCATION_LABEL}={name}); name one of them",
        )
    if candidates:
        try:
            return StorageLocation.of(candidates[0])
        except SpecError as exc:
            raise Refused("InvalidStorageLocation", f"CheckpointStorageLocation {name}: {exc}") from None
    if name == DEFAULT_LOCATION and context.settings.default_location:
        return StorageLocation(name=DEFAULT_LOCATION, url=context.settings.default_location)
    raise Refused(
        "UnknownStorageLocation",
        f"spec.storageLocation {name!r} is not one of release {context.settings.release}'s storage locations in "
        f"{namespace}: no CheckpointStorageLocation of the release has that name or label {LOCATION_LABEL}={name} "
        "(`kubectl get checkpointstoragelocations` lists them; the chart renders one per storage.locations entry)",
    )


async def usable(location: StorageLocation, write: bool, namespace: str, context: Context) -> None:
    """:class:`Refused` when a transaction may not use the location: a Checkpoint never writes to a ReadOnly one;
    nothing runs on one whose last validation failed and that still fails when checked again now (a store back
    since, as the embedded store after its restart, is used at once; its status follows at the next validation)."""
    if write and location.access_mode is AccessMode.READ_ONLY:
        raise Refused(
            "StorageLocationReadOnly",
            f"storage location {location.name} ({location.url}) is ReadOnly: restore from it, never checkpoint to "
            "it; name a ReadWrite location in spec.storageLocation",
        )
    if not location.unavailable:
        return
    available, reason, message = await check(location, namespace, context)
    if available:
        log.info(f"storage location {location.name} answers again: {message}")
        return
    raise Refused(
        "StorageLocationUnavailable",
        f"storage location {location.name} is Unavailable ({location.unavailable}; checked again now: {reason}: "
        f"{message}); fix it (`kubectl describe checkpointstoragelocation {location.resource}`) and create the "
        "resource again",
    )


async def storage_config(location: StorageLocation, namespace: str, context: Context) -> StorageConfig:
    """How the operator reaches a location (module docstring); LookupError when its Secret is missing or lacks a
    key."""
    settings = context.settings
    keys: dict[str, str] = {}
    if location.credential:
        data = await context.kube.secret_data(namespace, location.credential)
        try:
            keys = {"access_key_id": data["AWS_ACCESS_KEY_ID"], "secret_access_key": data["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as exc:
            raise LookupError(f"Secret {location.credential} has no {exc.args[0]}") from None
    return StorageConfig(
        endpoint_url=location.endpoint or settings.endpoint_url, region=location.region or settings.region, **keys
    )


async def check(location: StorageLocation, namespace: str, context: Context) -> tuple[bool, str, str]:
    """One validation: (available, reason, message)."""
    try:
        config = await storage_config(location, namespace, context)
    except LookupError as exc:
        return False, "CredentialsNotFound", str(exc)
    except KubeError as exc:
        return False, "CredentialsUnreadable", f"reading Secret {location.credential}: {exc}"
    try:
        await asyncio.wait_for(asyncio.to_thread(open_storage(location.url, config).probe), VALIDATION_TIMEOUT_S)
    except StorageError as exc:
        return False, "StorageUnreachable", str(exc)
    except TimeoutError:
        return False, "StorageUnreachable", f"{location.url} did not answer in {VALIDATION_TIMEOUT_S:g}s"
    return True, "Validated", f"{location.url} answered ({location.access_mode})"


@dataclass
class _Seen:
    generation: int | None
    at: float  # (monotonic)
    phase: str
    every: float  # seconds until it is validated again


#: what runs when a location is first found Available (the catalog sync: location, resource, namespace, context)
OnAvailable = Callable[[StorageLocation, dict[str, Any], str, Context], Awaitable[Any]]


@dataclass
class Validator:
    """The release's locations validated (module docstring); :meth:`run` until cancelled. ``on_available`` runs
    once per location per leadership, when it is first found Available (:func:`gym_operator.handlers.startup` gives
    the catalog sync)."""

    context: Context
    namespace: str
    on_available: OnAvailable
    #: location uid -> what the last validation found
    seen: dict[str, _Seen] = field(default_factory=dict)
    #: location uids whose checkpoints were synced in this leadership
    synced: set[str] = field(default_factory=set)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(KubeError):
                await self.tick()
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        for obj in await self.context.kube.list_objects(PLURAL, self.namespace):
            if not _ours(obj, self.context):
                continue
            meta = obj["metadata"]
            uid, generation = meta["uid"], meta.get("generation")
            last = self.seen.get(uid)
            if last is not None and last.generation == generation and time.monotonic() - last.at < last.every:
                continue
            try:
                every = LocationSpec.parse(obj.get("spec")).validation_frequency.total_seconds()
                location = StorageLocation.of({**obj, "status": {}})
            except SpecError as exc:
                await self._write(obj, False, "InvalidSpec", str(exc), last, float("inf"))
                continue
            every = float("inf") if every == 0 else max(MIN_FREQUENCY_S, every)
            available, reason, message = await check(location, self.namespace, self.context)
            await self._write(obj, available, reason, message, last, every)
            if available and uid not in self.synced:
                self.synced.add(uid)
                await self.on_available(location, obj, self.namespace, self.context)

    async def _write(
        self, obj: dict[str, Any], available: bool, reason: str, message: str, last: _Seen | None, every: float
    ) -> None:
        meta = obj["metadata"]
        phase = "Available" if available else "Unavailable"
        self.seen[meta["uid"]] = _Seen(meta.get("generation"), time.monotonic(), phase, every)
        status = {
            "phase": phase,
            "reason": reason,
            "message": message[:1000],
            "lastValidationTime": now(),
            "observedGeneration": meta.get("generation"),
            "conditions": [condition("Available", available, reason, message, meta.get("generation"))],
        }
        previous = (obj.get("status") or {}).get("phase")
        try:
            await self.context.kube.patch_status(PLURAL, self.namespace, meta["name"], status)
            if last is None or last.phase != phase or previous != phase:
                await self.context.kube.event(obj, reason, f"{phase}: {message}", warning=not available)
        except KubeError as exc:
            log.warning(f"CheckpointStorageLocation {meta['name']}: could not write its status ({exc})")
        if not available:
            log.warning(f"CheckpointStorageLocation {meta['name']} is Unavailable: {reason}: {message}")
