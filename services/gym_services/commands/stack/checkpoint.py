"""``gymckpt checkpoint``: one consistent checkpoint of every participant of the running stack."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
import uuid

from gym_services.commands.stack.configs import remember_configs
from gym_services.commands.stack.running import fail, running
from gym_services.commands.stack.storage import check_location
from gym_services.commands.stack.transaction import header, run_transaction
from gym_services.control.protocol import DEPRECATED_BACKGROUND, CheckpointMethod
from gym_services.control.storage import StorageError
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_services.stack.launcher import StackError, StackState


def new_checkpoint_id() -> str:
    return f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def cmd_checkpoint(args: argparse.Namespace) -> int:
    checkpoint_id = args.id or new_checkpoint_id()
    transaction_id = args.transaction_id or uuid.uuid4().hex
    again = f"gymckpt checkpoint --id {checkpoint_id} --transaction-id {transaction_id}"
    if args.method == DEPRECATED_BACKGROUND:
        print(f"gymckpt checkpoint: --method {DEPRECATED_BACKGROUND} is the old name of background", file=sys.stderr)
    try:
        state = running(args)
        location = args.storage or state.storage
        check_location(args, state, location)
    except (StackError, StorageError) as exc:
        return fail("checkpoint", exc)

    async def work(coordinator: Coordinator, state: StackState, cancel: asyncio.Event) -> TransactionResult:
        header(
            args,
            f"checkpoint {checkpoint_id} of {len(coordinator.participants)} participants -> {location} "
            f"(transaction {transaction_id})",
        )
        return await coordinator.checkpoint(
            checkpoint_id,
            location,
            prepare_timeout_s=args.prepare_timeout,
            lease_s=args.lease,
            transaction_id=transaction_id,
            claimed_by=f"gymckpt checkpoint on {socket.gethostname()} (stack {state.name})",
            method=CheckpointMethod(args.method),
            cancel=cancel,
        )

    code = run_transaction(args, "checkpoint", work, again)
    if code == 0:
        remember_configs(state, checkpoint_id)
    return code
