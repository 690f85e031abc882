"""Where the stack's checkpoints are and how the CLI reaches them: the location, the storage config (the stack's
local S3 store, --s3-endpoint, or the AWS variables), a location refused before anything is paused, and a storage
error told with what the stack knows."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gym_services.base.config import StorageConfig
from gym_services.control.storage import StorageError, open_storage
from gym_services.stack.launcher import StackError, StackState, read_state, stack_secrets
from gym_services.stack.objectstore import BUCKET, REGION, store_running


def _state(args: argparse.Namespace) -> StackState | None:
    try:
        return read_state(Path(args.state_dir).resolve())
    except StackError:
        return None


def location(args: argparse.Namespace) -> str:
    """--storage, else the stack's own location (:class:`StackError` when there is no stack)."""
    if args.storage:
        return str(args.storage)
    return read_state(Path(args.state_dir).resolve()).storage


def _in_own_bucket(args: argparse.Namespace) -> bool:
    given = getattr(args, "storage", None)
    return given is None or given.startswith(f"s3://{BUCKET}/")


def storage_config(args: argparse.Namespace, state: StackState | None = None) -> StorageConfig:
    """How the CLI reaches storage: --s3-endpoint, else the stack's local S3 store (for its own bucket),
    else the standard AWS variables."""
    endpoint = getattr(args, "s3_endpoint", None)
    if state is None:
        state = _state(args)
    store = state.object_store if state is not None else None
    if store is not None and state is not None and not endpoint and _in_own_bucket(args):
        creds = stack_secrets(Path(state.state_dir))
        return StorageConfig(
            endpoint_url=store.endpoint,
            region=REGION,
            access_key_id=creds["s3_access_key"],
            secret_access_key=creds["s3_secret_key"],
        )
    return StorageConfig(endpoint_url=endpoint or os.environ.get("AWS_ENDPOINT_URL"))


def storage_hint(args: argparse.Namespace, exc: Exception) -> Exception:
    """A storage error with what the stack knows: its local S3 store stopped with it, or where its own
    checkpoints are."""
    if not isinstance(exc, StorageError):
        return exc
    state = _state(args)
    if state is None:
        return exc
    given = getattr(args, "storage", None)
    if state.object_store is not None and not store_running(state.object_store) and _in_own_bucket(args):
        return StorageError(
            f"{exc}; the stack's local S3 store stopped with the stack (`gymckpt down`): "
            "`gymckpt up CONFIG --storage embedded-s3` starts it again, with its data"
        )
    if given and given != state.storage:
        return StorageError(
            f"{exc}; the stack {state.name} keeps its checkpoints at {state.storage}, used when --storage is not given"
        )
    return exc


def check_location(args: argparse.Namespace, state: StackState, where: str) -> None:
    """Refuse a storage location that cannot be used before anything is paused: an unsupported form,
    or a file:// folder that cannot be created."""
    open_storage(where, storage_config(args, state))  # StorageError for an unsupported location
    if where.startswith("file://"):
        folder = Path(where.removeprefix("file://"))
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the storage folder {folder}: {exc.strerror or exc}; "
                "give a folder you can write with --storage file:///absolute/path"
            ) from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StorageError(f"the storage folder {folder} is not writable; give another with --storage")
