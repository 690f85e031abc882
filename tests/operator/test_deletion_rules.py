"""The rules of a Checkpoint's end (gym_operator.controllers.deletion), without a cluster: when it expires, and which
Restores hold its stored objects (those that have not ended and read it, by name or by id and storage location)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import kopf
import pytest

from gym_operator.controllers.deletion import restore_reads
from gym_operator.controllers.expiry import expiration

CREATED = "2026-01-02T03:04:05Z"


def body(**spec: Any) -> kopf.Body:
    raw = {"metadata": {"name": "ck", "creationTimestamp": CREATED}, "spec": {"release": "r", **spec}}
    return kopf.Body(raw)  # type: ignore[arg-type]


def test_a_checkpoint_expires_its_ttl_after_its_creation() -> None:
    created = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert expiration(body(ttl="1h30m")) == created + dt.timedelta(hours=1, minutes=30)
    assert expiration(body(ttl="0s")) == created
    assert expiration(body()) is None  # no ttl: it stays until deleted
    assert expiration(body(ttl="soon")) is None  # an invalid spec never expires (its transaction failed)


@pytest.mark.parametrize(
    "restore, reads",
    [
        ({"spec": {"checkpointRef": {"name": "ck"}}}, True),
        ({"spec": {"checkpointRef": {"name": "ck"}}, "status": {"phase": "Restoring"}}, True),
        ({"spec": {"checkpointRef": {"name": "ck"}}, "status": {"phase": "Completed"}}, False),
        ({"spec": {"checkpointRef": {"name": "ck"}}, "status": {"phase": "Failed"}}, False),
        ({"spec": {"checkpointRef": {"name": "other"}}}, False),
        ({"spec": {"checkpointId": "ck-1"}}, True),  # storageLocation defaults to default
        ({"spec": {"checkpointId": "ck-1", "storageLocation": "default"}}, True),
        ({"spec": {"checkpointId": "ck-1", "storageLocation": "elsewhere"}}, False),
        ({"spec": {"checkpointId": "ck-2"}}, False),
    ],
)
def test_a_restore_holds_the_data_while_it_reads_them(restore: dict[str, Any], reads: bool) -> None:
    assert restore_reads(restore, "ck", "ck-1", "default") is reads


def test_a_checkpoint_with_no_id_is_read_only_by_name() -> None:
    assert restore_reads({"spec": {"checkpointId": ""}}, "ck", None, "default") is False
    assert restore_reads({"spec": {"checkpointRef": {"name": "ck"}}}, "ck", None, "default") is True
