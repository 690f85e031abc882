"""Publishing when S3 stored the global manifest but its answer was lost (chaos kind e: S3 killed right after a
write): the client's retry of the conditional put is refused as "already exists". The manifest there is this
transaction's, so the checkpoint is published and reported completed (before: failed - "published by someone
else" - while a complete checkpoint stood in storage); a manifest of another transaction is still a conflict."""

from __future__ import annotations

import re

import pytest
from tests.services.coordination.recorders import run

from gym_services.control import layout
from gym_services.control.storage import AlreadyExists, open_storage
from gym_services.coordination.coordinator import Coordinator


def lose_the_answer(storage, key: str, other: bool = False):
    """``storage`` whose conditional put of ``key`` stores it (as another transaction's, when ``other``) and then
    answers as a retried put would: it already exists."""
    put_if_absent = storage.put_if_absent

    def put(k: str, data: bytes) -> None:
        if k == key and other:
            data = re.sub(rb'"transaction_id": "[^"]+"', b'"transaction_id": "another-transaction"', data)
        put_if_absent(k, data)
        if k == key:
            raise AlreadyExists(f"{k} already exists")

    storage.put_if_absent = put
    return storage


@pytest.mark.parametrize("method", ["background", "sync"])
async def test_a_lost_answer_to_the_publishing_put_is_still_published(stack, tmp_path, method) -> None:
    storage_url = f"file://{tmp_path / 'store'}"  # the lost answer is made above the storage: one backend is enough

    class LostAnswer(Coordinator):
        def _storage(self, location):
            return lose_the_answer(super()._storage(location), layout.global_manifest_key("ck-1"))

    async def go(coordinator, transport, events):
        coordinator.__class__ = LostAnswer
        return await coordinator.checkpoint("ck-1", storage_url, prepare_timeout_s=5, method=method)

    result = await run(stack, go)
    assert result.status == "completed", result.error
    stored = open_storage(storage_url).get(layout.global_manifest_key("ck-1"))
    assert result.transaction_id and result.transaction_id.encode() in stored


async def test_another_transactions_manifest_is_still_a_conflict(stack, tmp_path) -> None:
    storage_url = f"file://{tmp_path / 'store'}"

    class Raced(Coordinator):
        def _storage(self, location):
            return lose_the_answer(super()._storage(location), layout.global_manifest_key("ck-1"), other=True)

    async def go(coordinator, transport, events):
        coordinator.__class__ = Raced
        return await coordinator.checkpoint("ck-1", storage_url, prepare_timeout_s=5, method="sync")

    result = await run(stack, go)
    assert result.status == "failed" and "published by someone else" in str(result.error), result.error
