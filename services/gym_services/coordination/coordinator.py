"""The checkpoint / restore transaction over a set of participants (DESIGN §8).

Free of kopf and Kubernetes: the CLI drives it for a local stack, the operator for pods.

checkpoint = prepare by role (controller, environment, model, agent, resources), renewing
leases -> blockers at the deadline abort everything -> commit (controller first: its live
episodes are the scope of the others) -> check every participant manifest -> publish the
global manifest last with a conditional put -> resume in reverse role order.

restore = read and verify the global manifest -> restore every participant -> any failure
aborts all (nothing stays installed) -> resume in reverse role order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.base.config import StorageConfig
from gym_services.base.logs import get_logger
from gym_services.control import layout
from gym_services.control.decisions import read_decision, settle
from gym_services.control.models import (
    ROLE_ORDER,
    SCHEMA_VERSION,
    GlobalManifest,
    ManifestParticipant,
    Role,
    StorageAccess,
)
from gym_services.control.participant import InvalidState
from gym_services.control.records import parse_participant_manifest, sha256
from gym_services.control.storage import AlreadyExists, NotFound, Storage, StorageError, open_storage

log = get_logger("coordinator")
EventSink = Callable[[str, dict[str, Any]], Awaitable[None] | None]


class TransactionError(Exception):
    """The transaction could not complete; the stack was aborted and resumed."""


class BlockerInfo(BaseModel):
    participant: str
    kind: str
    id: str
    detail: str = ""


class ParticipantSummary(BaseModel):
    participant_id: str
    role: Role
    records: int = 0
    bytes: int = 0
    manifest_key: str | None = None
    episodes: int = 0


class TransactionResult(BaseModel):
    """What the CLI prints and the operator writes into a resource's status."""

    kind: Literal["checkpoint", "restore"]
    checkpoint_id: str
    location: str
    status: Literal["completed", "failed"]
    phase: str = Field(description="the last phase reached")
    participants: list[ParticipantSummary] = Field(default_factory=list)
    blockers: list[BlockerInfo] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    pause_s: float = 0.0
    records: int = 0
    bytes: int = 0
    episodes: dict[str, int] = Field(default_factory=dict, description="rollout -> attempt (restore) or 0")
    manifest_key: str | None = None
    restore_id: str | None = Field(default=None, description="the restore transaction's name (restores only)")
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)


def by_role(participants: Iterable[ParticipantRef]) -> list[list[ParticipantRef]]:
    """Participants grouped in prepare order; one role's participants are driven together."""
    groups: dict[Role, list[ParticipantRef]] = {role: [] for role in ROLE_ORDER}
    for ref in participants:
        groups[ref.role].append(ref)
    return [groups[role] for role in ROLE_ORDER if groups[role]]


class Coordinator:
    def __init__(
        self,
        participants: Iterable[ParticipantRef],
        client: ControlClient,
        *,
        storage_config: StorageConfig | None = None,
        participant_storage: StorageAccess | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        """``storage_config`` is how the coordinator reaches storage; ``participant_storage``, when
        given, travels with commit and restore so servers reach it the same way instead of by their
        own storage config (a Checkpoint naming its own endpoint or credentials)."""
        self.participants = list(participants)
        ids = [p.participant_id for p in self.participants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"participant ids must be unique: {ids}")
        self.client = client
        self.storage_config = storage_config or StorageConfig()
        self._access = {"storage": participant_storage.wire()} if participant_storage else {}
        self.on_event = on_event

    # --- plumbing -----------------------------------------------------------------

    async def _emit(self, phase: str, **detail: Any) -> None:
        log.info(phase, extra=detail)
        if self.on_event is not None:
            result = self.on_event(phase, detail)
            if asyncio.iscoroutine(result):
                await result

    def _storage(self, location: str) -> Storage:
        return open_storage(location, self.storage_config)

    async def _in_thread(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    async def _each(
        self, refs: list[ParticipantRef], verb: str, body: Callable[[ParticipantRef], dict], timeout_s: float | None = None
    ) -> tuple[dict[str, dict], dict[str, ParticipantError]]:
        """Call ``verb`` on every ref concurrently; answers and failures by participant id."""

        async def one(ref: ParticipantRef):
            return await self.client.call(ref, verb, body(ref), timeout_s=timeout_s)

        results = await asyncio.gather(*(one(r) for r in refs), return_exceptions=True)
        ok: dict[str, dict] = {}
        failed: dict[str, ParticipantError] = {}
        for ref, res in zip(refs, results, strict=True):
            if isinstance(res, ParticipantError):
                failed[ref.participant_id] = res
            elif isinstance(res, BaseException):
                failed[ref.participant_id] = ParticipantError(ref, verb, f"{type(res).__name__}: {res}")
            else:
                ok[ref.participant_id] = res
        return ok, failed

    @contextlib.asynccontextmanager
    async def _leases(self, checkpoint_id: str, lease_s: float, refs: list[ParticipantRef]):
        """Renew the lease of every touched participant while the transaction runs."""
        touched: list[ParticipantRef] = []

        async def renew() -> None:
            while True:
                await asyncio.sleep(max(0.05, lease_s / 3))
                for ref in list(touched):
                    with contextlib.suppress(ParticipantError):
                        await self.client.call(ref, "lease", {"checkpoint_id": checkpoint_id}, timeout_s=lease_s / 3)

        task = asyncio.create_task(renew())
        try:
            yield touched
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _finish_all(self, verb: str, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Resume or abort in reverse role order; returns warnings for participants that failed."""
        warnings: list[str] = []
        for group in reversed(by_role(refs)):
            _, failed = await self._each(group, verb, lambda r: {"checkpoint_id": checkpoint_id})
            for err in failed.values():
                if err.code == "unknown_checkpoint":
                    continue  # already closed (lease expiry, or it never got the checkpoint)
                warnings.append(f"{err} (its lease will reopen it)")
        return warnings

    # --- checkpoint ----------------------------------------------------------------

    async def checkpoint(
        self, checkpoint_id: str, location: str, *, prepare_timeout_s: float = 30.0, lease_s: float = 30.0
    ) -> TransactionResult:
        result = TransactionResult(
            kind="checkpoint", checkpoint_id=checkpoint_id, location=location, status="failed", phase="Pending"
        )
        storage = self._storage(location)
        existing = await self._published(storage, checkpoint_id)
        if existing is not None:
            return self._from_manifest(result, existing, "already published; nothing to do")
        started = time.perf_counter()
        timings = result.timings
        deadline = time.monotonic() + prepare_timeout_s
        async with self._leases(checkpoint_id, lease_s, self.participants) as touched:
            try:
                # prepare
                result.phase = "Preparing"
                await self._emit("Preparing", checkpoint_id=checkpoint_id, participants=len(self.participants))
                t0 = time.perf_counter()
                for group in by_role(self.participants):
                    touched.extend(group)
                    remaining = max(0.05, deadline - time.monotonic())
                    ok, failed = await self._each(
                        group,
                        "prepare",
                        lambda r: {"checkpoint_id": checkpoint_id, "deadline_s": remaining, "lease_s": lease_s},
                        timeout_s=remaining + 10,
                    )
                    for pid, answer in ok.items():
                        for b in answer.get("blockers", []):
                            result.blockers.append(BlockerInfo(participant=pid, **b))
                    if failed:
                        raise TransactionError("; ".join(str(e) for e in failed.values()))
                    if result.blockers:
                        names = ", ".join(sorted({b.participant for b in result.blockers}))
                        raise TransactionError(
                            f"{len(result.blockers)} blockers at the prepare deadline ({prepare_timeout_s}s) on {names}"
                        )
                timings["prepare"] = time.perf_counter() - t0

                # commit: the controller first, its live episodes scope everyone else
                result.phase = "Committing"
                await self._emit("Committing", checkpoint_id=checkpoint_id)
                t0 = time.perf_counter()
                commits: dict[str, dict] = {}
                controllers = [p for p in self.participants if p.role == "controller"]
                others = [p for p in self.participants if p.role != "controller"]
                episodes: list[str] | None = None
                if controllers:
                    ok, failed = await self._each(
                        controllers, "commit", lambda r: {"checkpoint_id": checkpoint_id, "location": location, **self._access}
                    )
                    if failed:
                        raise TransactionError("; ".join(str(e) for e in failed.values()))
                    commits.update(ok)
                    episodes = sorted({e for answer in ok.values() for e in answer.get("episodes", [])})
                if others:
                    ok, failed = await self._each(
                        others,
                        "commit",
                        lambda r: {"checkpoint_id": checkpoint_id, "location": location, "episodes": episodes, **self._access},
                    )
                    if failed:
                        raise TransactionError("; ".join(str(e) for e in failed.values()))
                    commits.update(ok)
                timings["commit"] = time.perf_counter() - t0

                # verify what every participant wrote
                t0 = time.perf_counter()
                await self._verify_manifests(storage, checkpoint_id, commits)
                timings["verify"] = time.perf_counter() - t0

                # publish
                result.phase = "Publishing"
                await self._emit("Publishing", checkpoint_id=checkpoint_id)
                t0 = time.perf_counter()
                manifest = GlobalManifest(
                    schema_version=SCHEMA_VERSION,
                    checkpoint_id=checkpoint_id,
                    created_at=time.time(),
                    participants=[
                        ManifestParticipant(
                            participant_id=p.participant_id,
                            role=p.role,
                            manifest_key=commits[p.participant_id]["manifest_key"],
                            manifest_sha256=commits[p.participant_id]["manifest_sha256"],
                            manifest_size=commits[p.participant_id]["manifest_size"],
                            records=commits[p.participant_id]["records"],
                            bytes=commits[p.participant_id]["bytes"],
                        )
                        for p in self.participants
                    ],
                    episodes=episodes,
                    timings={k: round(v, 6) for k, v in timings.items()},
                    bytes=sum(c["bytes"] for c in commits.values()),
                )
                key = layout.global_manifest_key(checkpoint_id)
                try:
                    await self._in_thread(storage.put_if_absent, key, manifest.model_dump_json(indent=1).encode())
                except AlreadyExists:
                    raise TransactionError(f"checkpoint {checkpoint_id} was published by someone else") from None
                timings["publish"] = time.perf_counter() - t0
                result.manifest_key = key
            except (TransactionError, StorageError, InvalidState) as exc:
                result.error = str(exc)
                await self._emit("Aborting", checkpoint_id=checkpoint_id, error=result.error)
                result.warnings += await self._finish_all("abort", checkpoint_id, touched)
                result.pause_s = time.perf_counter() - started
                timings["pause"] = result.pause_s
                await self._emit("Failed", checkpoint_id=checkpoint_id, error=result.error)
                return result

            # resume, in reverse order
            result.phase = "Resuming"
            await self._emit("Resuming", checkpoint_id=checkpoint_id)
            t0 = time.perf_counter()
            result.warnings += await self._finish_all("resume", checkpoint_id, self.participants)
            timings["resume"] = time.perf_counter() - t0
        result.pause_s = time.perf_counter() - started
        timings["pause"] = result.pause_s
        result.participants = [
            ParticipantSummary(
                participant_id=p.participant_id,
                role=p.role,
                records=commits[p.participant_id]["records"],
                bytes=commits[p.participant_id]["bytes"],
                manifest_key=commits[p.participant_id]["manifest_key"],
                episodes=len(commits[p.participant_id].get("episodes", [])),
            )
            for p in self.participants
        ]
        result.records = sum(p.records for p in result.participants)
        result.bytes = sum(p.bytes for p in result.participants)
        result.episodes = {e: 0 for e in (episodes or [])}
        result.status, result.phase = "completed", "Completed"
        await self._emit("Completed", checkpoint_id=checkpoint_id, pause_s=round(result.pause_s, 4), bytes=result.bytes)
        return result

    async def _verify_manifests(self, storage: Storage, checkpoint_id: str, commits: dict[str, dict]) -> None:
        """Every participant manifest is there, matches its digest, and lists what commit said."""

        def check(pid: str, answer: dict) -> None:
            try:
                data = storage.get(answer["manifest_key"])
            except NotFound:
                raise TransactionError(f"participant {pid} reported a manifest that is not in storage") from None
            if sha256(data) != answer["manifest_sha256"]:
                raise TransactionError(f"participant {pid}'s manifest does not match the digest it reported")
            manifest = parse_participant_manifest(data)
            if manifest.checkpoint_id != checkpoint_id or manifest.participant_id != pid:
                raise TransactionError(f"participant {pid}'s manifest names {manifest.participant_id}/{manifest.checkpoint_id}")
            if len(manifest.records) != answer["records"]:
                raise TransactionError(f"participant {pid}'s manifest lists {len(manifest.records)} records, commit said {answer['records']}")

        await asyncio.gather(*(self._in_thread(check, pid, ans) for pid, ans in commits.items()))

    async def _published(self, storage: Storage, checkpoint_id: str) -> GlobalManifest | None:
        try:
            data = await self._in_thread(storage.get, layout.global_manifest_key(checkpoint_id))
        except NotFound:
            return None
        return parse_global_manifest(data)

    def _from_manifest(self, result: TransactionResult, manifest: GlobalManifest, note: str) -> TransactionResult:
        result.status, result.phase = "completed", "Completed"
        result.manifest_key = layout.global_manifest_key(manifest.checkpoint_id)
        result.participants = [
            ParticipantSummary(
                participant_id=p.participant_id, role=p.role, records=p.records, bytes=p.bytes, manifest_key=p.manifest_key
            )
            for p in manifest.participants
        ]
        result.records = sum(p.records for p in manifest.participants)
        result.bytes = manifest.bytes
        result.timings = dict(manifest.timings)
        result.pause_s = manifest.timings.get("pause", 0.0)
        result.episodes = {e: 0 for e in manifest.episodes or []}
        result.warnings.append(note)
        return result

    # --- restore -------------------------------------------------------------------

    async def restore(
        self, checkpoint_id: str, location: str, *, lease_s: float = 30.0, restore_id: str | None = None
    ) -> TransactionResult:
        """Restore every participant, decide, resume; all or nothing.

        ``restore_id`` names the transaction (the Restore resource's uid on Kubernetes, so an
        operator restarted mid-restore repeats the same one; a fresh id otherwise). Once every
        participant has restored, ``resume`` is written as the restore's decision before anyone
        resumes: participants whose lease runs out follow that object, so a coordinator dying
        between two resumes still leaves the restore installed everywhere, and one dying before
        it leaves it installed nowhere.
        """
        restore_id = restore_id or uuid.uuid4().hex
        result = TransactionResult(
            kind="restore", checkpoint_id=checkpoint_id, location=location, status="failed", phase="Pending",
            restore_id=restore_id,
        )
        started = time.perf_counter()
        storage = self._storage(location)
        try:
            manifest = await self._published(storage, checkpoint_id)
            earlier = await self._in_thread(read_decision, storage, checkpoint_id, restore_id)
        except (StorageError, InvalidState) as exc:
            result.error = f"cannot read checkpoint {checkpoint_id}: {exc}"
            return result
        if earlier == "abort":
            result.error = (
                f"restore {restore_id} of checkpoint {checkpoint_id} was abandoned earlier (a participant's lease ran out "
                "before it was decided) and undone everywhere; start a new restore"
            )
            return result
        if manifest is None:
            result.error = (
                f"checkpoint {checkpoint_id} has no manifest at {storage.url}/{layout.global_manifest_key(checkpoint_id)}: "
                "it is unknown or incomplete and is never restored"
            )
            return result
        current = {p.participant_id: p for p in self.participants}
        missing = [p.participant_id for p in manifest.participants if p.participant_id not in current]
        wrong_role = [
            p.participant_id for p in manifest.participants if p.participant_id in current and current[p.participant_id].role != p.role
        ]
        if missing or wrong_role:
            result.error = (
                f"checkpoint {checkpoint_id} needs participants that are not here: missing {missing}, wrong role {wrong_role}"
            )
            return result
        refs = [current[p.participant_id] for p in manifest.participants]
        entries = {p.participant_id: p for p in manifest.participants}
        async with self._leases(checkpoint_id, lease_s, refs) as touched:
            result.phase = "Restoring"
            await self._emit("Restoring", checkpoint_id=checkpoint_id, participants=len(refs))
            t0 = time.perf_counter()
            touched.extend(refs)
            ok, failed = await self._each(
                refs,
                "restore",
                lambda r: {
                    "checkpoint_id": checkpoint_id,
                    "location": location,
                    "manifest_key": entries[r.participant_id].manifest_key,
                    "manifest_sha256": entries[r.participant_id].manifest_sha256,
                    "lease_s": lease_s,
                    "restore_id": restore_id,
                    **self._access,
                },
                timeout_s=max(60.0, lease_s * 4),
            )
            result.timings["restore"] = time.perf_counter() - t0
            error = "; ".join(str(e) for e in failed.values())
            if not error:  # every participant restored: the outcome is written before anyone resumes
                error = await self._decide(storage, checkpoint_id, restore_id)
            if error:
                result.error = error
                await self._emit("Aborting", checkpoint_id=checkpoint_id, error=result.error)
                result.warnings += await self._finish_all("abort", checkpoint_id, refs)
                await self._emit("Failed", checkpoint_id=checkpoint_id, error=result.error)
                return result
            result.phase = "Resuming"
            await self._emit("Resuming", checkpoint_id=checkpoint_id)
            t0 = time.perf_counter()
            result.warnings += await self._finish_all("resume", checkpoint_id, refs)
            result.timings["resume"] = time.perf_counter() - t0
        result.pause_s = time.perf_counter() - started
        result.timings["total"] = result.pause_s
        for ref in refs:
            answer = ok[ref.participant_id]
            result.participants.append(
                ParticipantSummary(
                    participant_id=ref.participant_id,
                    role=ref.role,
                    records=answer["records"],
                    bytes=answer["bytes"],
                    manifest_key=entries[ref.participant_id].manifest_key,
                    episodes=len(answer.get("episodes", {})),
                )
            )
            for rollout, attempt in answer.get("episodes", {}).items():
                result.episodes[rollout] = max(result.episodes.get(rollout, 0), attempt)
        result.records = sum(p.records for p in result.participants)
        result.bytes = sum(p.bytes for p in result.participants)
        result.manifest_key = layout.global_manifest_key(checkpoint_id)
        result.status, result.phase = "completed", "Completed"
        await self._emit("Completed", checkpoint_id=checkpoint_id, records=result.records)
        return result

    async def _decide(self, storage: Storage, checkpoint_id: str, restore_id: str) -> str:
        """Write ``resume`` as the restore's decision; empty when it holds, else why not."""
        try:
            decision = await self._in_thread(settle, storage, checkpoint_id, restore_id, "resume", "coordinator")
        except (StorageError, InvalidState) as exc:
            try:  # the put may have landed before the error: the object says what holds
                decision = await self._in_thread(read_decision, storage, checkpoint_id, restore_id)
            except (StorageError, InvalidState):
                decision = None
            if decision is None:
                return f"cannot write the decision of restore {restore_id}: {exc}"
        if decision == "abort":
            return f"a participant's lease ran out before restore {restore_id} was decided; it is undone everywhere"
        return ""

    # --- retire and status -----------------------------------------------------------

    async def retire(self, rollout_id: str, attempt: int) -> dict[str, bool]:
        """Drop one attempt: environment, then agent, then model and resources together."""
        order: list[tuple[Role, ...]] = [("environment",), ("agent",), ("model", "resources"), ("controller",)]
        dropped: dict[str, bool] = {}
        for roles in order:
            group = [p for p in self.participants if p.role in roles]
            if not group:
                continue
            ok, failed = await self._each(group, "retire", lambda r: {"rollout_id": rollout_id, "attempt": attempt})
            if failed:
                raise TransactionError("; ".join(str(e) for e in failed.values()))
            dropped.update({pid: bool(a.get("retired")) for pid, a in ok.items()})
        return dropped

    async def status(self) -> dict[str, dict]:
        ok, failed = await self._each(self.participants, "status", lambda r: {})
        for pid, err in failed.items():
            ok[pid] = {"participant_id": pid, "error": err.reason}
        return ok


def parse_global_manifest(data: bytes) -> GlobalManifest:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"checkpoint manifest is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidState("checkpoint manifest has an unsupported schema_version")
    try:
        return GlobalManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"checkpoint manifest is malformed: {exc.errors(include_url=False)[:3]}") from None


def list_checkpoints(location: str, storage_config: StorageConfig | None = None) -> list[tuple[str, GlobalManifest | None]]:
    """Checkpoint ids at a location with their manifest (None when incomplete)."""
    storage = open_storage(location, storage_config)
    out: list[tuple[str, GlobalManifest | None]] = []
    for cid in storage.list_folders("checkpoints"):
        try:
            out.append((cid, parse_global_manifest(storage.get(layout.global_manifest_key(cid)))))
        except (NotFound, InvalidState):
            out.append((cid, None))
    return out
