"""``gymckpt restore``: one checkpoint into every participant of the running (fresh) stack, all or nothing.

Refused before anything is paused when the checkpoint is not at the location (naming where it looked and what
is there) or holds a participant the stack has no server for; a server config changed since the checkpoint was
taken is a warning."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import uuid

from gym_services.commands.stack.configs import config_changes
from gym_services.commands.stack.running import fail, running
from gym_services.commands.stack.storage import storage_config, storage_hint
from gym_services.commands.stack.transaction import header, run_transaction
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.coordinator import Coordinator, TransactionResult, list_checkpoints
from gym_services.stack.launcher import StackError, StackState


def cmd_restore(args: argparse.Namespace) -> int:
    restore_id = args.restore_id or uuid.uuid4().hex
    try:
        state = running(args)
        location = args.storage or state.storage
        refused = _refusal(args, state, location)
    except (StackError, StorageError, ValueError) as exc:
        return fail("restore", storage_hint(args, exc))
    if refused is not None:
        return fail("restore", refused)
    changed = config_changes(state, args.checkpoint_id)
    if changed:
        print(
            f"gymckpt restore: warning: server configs changed since {args.checkpoint_id} was taken: "
            f"{', '.join(changed)}; its episodes continue under the new configs",
            file=sys.stderr,
        )

    async def work(coordinator: Coordinator, state: StackState, cancel: asyncio.Event) -> TransactionResult:
        header(
            args,
            f"restore {args.checkpoint_id} from {location} into {len(coordinator.participants)} participants "
            f"(restore id {restore_id})",
        )
        return await coordinator.restore(
            args.checkpoint_id, location, lease_s=args.lease, restore_id=restore_id, cancel=cancel
        )

    return run_transaction(args, "restore", work, f"gymckpt restore {args.checkpoint_id} --restore-id {restore_id}")


def _refusal(args: argparse.Namespace, state: StackState, location: str) -> Exception | None:
    """Why this restore cannot start, or None: the checkpoint is missing, or the stack lacks a server of it."""
    missing = _missing_checkpoint(args, state, location)
    if missing:
        return RuntimeError(missing)
    absent = _absent_servers(args, state, location)
    if absent:
        return StackError(
            f"checkpoint {args.checkpoint_id} holds the state of {', '.join(absent)}, which stack {state.name} "
            "has no server for; a restore needs every one: add them back to the stack YAML, "
            "then `gymckpt down` and `gymckpt up CONFIG`"
        )
    return None


def _missing_checkpoint(args: argparse.Namespace, state: StackState, location: str) -> str | None:
    """None when the checkpoint's manifest is at ``location``; else a message naming where it looked
    and what to do next."""
    store = CheckpointStore(open_storage(location, storage_config(args, state)))
    key = store.manifest_key(args.checkpoint_id)
    if store.is_published(args.checkpoint_id):
        return None
    known = [cid for cid, manifest in list_checkpoints(location, storage_config(args, state)) if manifest is not None]
    there = f"checkpoints there: {', '.join(known)}" if known else "no complete checkpoint is there"
    hint = (
        "pass the location it was written to with --storage (e.g. --storage s3://bucket/prefix, with AWS_ENDPOINT_URL "
        "and keys set for a non-AWS store)"
        if not args.storage
        else "check the id (`gymckpt checkpoints list --storage LOCATION`)"
    )
    return f"no checkpoint {args.checkpoint_id} at {location} (looked for {store.url}/{key}); {there}; {hint}"


def _absent_servers(args: argparse.Namespace, state: StackState, location: str) -> list[str]:
    """Participants of the checkpoint whose server (or replica group) the stack does not have at all."""
    manifest = CheckpointStore(open_storage(location, storage_config(args, state))).published(args.checkpoint_id)
    if manifest is None:
        return []
    here = {s.name for s in state.participants()} | {s.group_name for s in state.participants()}
    return sorted(
        p.participant_id
        for p in manifest.participants
        if p.participant_id not in here and re.sub(r"-\d+$", "", p.participant_id) not in here
    )
