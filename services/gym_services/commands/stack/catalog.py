"""``gymckpt checkpoints list/show/delete/prune``: the checkpoints at a storage location (the stack's, or
--storage)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

from gym_services.base.text import human_bytes, table
from gym_services.commands.stack.running import fail, running, with_coordinator
from gym_services.commands.stack.storage import location, storage_config, storage_hint
from gym_services.control.models import GlobalManifest
from gym_services.control.participant import InvalidState
from gym_services.control.retention import CheckpointInFlight, Retention, restoring
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.coordinator import Coordinator, list_checkpoints
from gym_services.stack.launcher import StackError, StackState


def _store(args: argparse.Namespace, where: str) -> CheckpointStore:
    return CheckpointStore(open_storage(where, storage_config(args)))


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    try:
        where = location(args)
        found = list_checkpoints(where, storage_config(args))
    except (StackError, StorageError) as exc:
        return fail("checkpoints list", storage_hint(args, exc))
    rows = [_list_row(cid, manifest) for cid, manifest in found]
    print(f"checkpoints at {where}:")
    print(
        table(["id", "state", "created", "method", "participants", "records", "bytes", "pause"], rows)
        if rows
        else "(none)"
    )
    return 0


def _list_row(cid: str, manifest: GlobalManifest | None) -> list[object]:
    if manifest is None:
        return [cid, "incomplete", "", "", "", "", "", ""]
    pause = manifest.timings.get("pause")
    return [
        cid,
        "complete",
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest.created_at)),
        manifest.method,
        len(manifest.participants),
        sum(p.records for p in manifest.participants),
        human_bytes(manifest.bytes),
        "" if pause is None else f"{pause * 1000:.0f} ms",
    ]


def cmd_checkpoints_show(args: argparse.Namespace) -> int:
    try:
        where = location(args)
        store = _store(args, where)
        manifest = store.published(args.checkpoint_id)
        if manifest is None:
            raise StackError(f"no complete checkpoint {args.checkpoint_id} at {where}; see `gymckpt checkpoints list`")
    except (StackError, StorageError, ValueError) as exc:
        return fail("checkpoints show", storage_hint(args, exc))
    if args.json:
        print(manifest.model_dump_json(indent=1))
        return 0
    print(
        f"checkpoint {manifest.checkpoint_id} at {where}, created {time.ctime(manifest.created_at)}, "
        f"method {manifest.method}"
        + (f", reads objects of {', '.join(manifest.references)}" if manifest.references else "")
    )
    print(
        table(
            ["participant", "role", "records", "reused", "bytes", "written", "manifest"],
            [
                [
                    p.participant_id,
                    p.role,
                    p.records,
                    p.reused,
                    human_bytes(p.bytes),
                    human_bytes(p.written_bytes),
                    p.manifest_key,
                ]
                for p in manifest.participants
            ],
        )
    )
    print(
        f"episodes continued: {len(manifest.episodes or [])}; timings: "
        + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in manifest.timings.items())
    )
    for p in manifest.participants:
        for line in p.scope.lines(p.participant_id):
            print(f"scope: {line}")
    restores = store.decisions(args.checkpoint_id)
    if restores:
        print(table(["restore id", "decision", "decided by"], [list(r) for r in restores]))
    return 0


def _restoring_locally(args: argparse.Namespace, checkpoint_id: str) -> list[str]:
    """Participants of the local stack (when one runs) restoring this checkpoint right now."""
    try:
        running(args)
    except StackError:
        return []

    async def work(coordinator: Coordinator, _state: StackState) -> list[str]:
        return restoring(await coordinator.status(), checkpoint_id)

    return asyncio.run(with_coordinator(args, work, running_only=True))


def cmd_checkpoints_delete(args: argparse.Namespace) -> int:
    try:
        where = location(args)
        busy = _restoring_locally(args, args.checkpoint_id)
        if busy:
            return fail(
                "checkpoints delete",
                StackError(
                    f"{', '.join(busy)} of the running stack are restoring {args.checkpoint_id}; "
                    "wait for the restore to finish (`gymckpt status`), then delete"
                ),
            )
        deleted = Retention(_store(args, where)).delete(
            args.checkpoint_id, by=f"gymckpt checkpoints delete on {socket.gethostname()}"
        )
    except (StackError, StorageError, CheckpointInFlight, InvalidState) as exc:
        return fail("checkpoints delete", storage_hint(args, exc))
    if deleted.objects == 0 and not deleted.kept:
        return fail(
            "checkpoints delete",
            StackError(f"no checkpoint {args.checkpoint_id} at {where}; see `gymckpt checkpoints list`"),
        )
    what = "checkpoint" if deleted.published else "incomplete checkpoint"
    print(
        f"deleted {what} {args.checkpoint_id} at {where}: {deleted.objects} objects"
        + (
            f"; {deleted.kept} kept while other checkpoints read them (`gymckpt checkpoints prune` removes them "
            "once none does)"
            if deleted.kept
            else ""
        )
    )
    return 0


def cmd_checkpoints_prune(args: argparse.Namespace) -> int:
    try:
        where = location(args)
        pruned = Retention(_store(args, where)).prune()
    except (StackError, StorageError, InvalidState) as exc:
        return fail("checkpoints prune", storage_hint(args, exc))
    for deleted in pruned:
        print(
            f"removed {deleted.objects} objects of {deleted.checkpoint_id}"
            + (f" ({deleted.kept} still read by other checkpoints)" if deleted.kept else "")
        )
    print(f"pruned {len(pruned)} checkpoints at {where} that will never be published")
    return 0
