"""NeMo Gym's ``run_conformance`` against our token ledger, over its HTTP routes.

Runs in the oracle environment (``oracle/reference.py``), as a script:

    <oracle python> ledger_adapter.py suite <unpacked wheel> <repo services dir> <rollout id> <url> [<url> ...]

or, to print the wheel's lineage hashes of item lists given on stdin:

    <oracle python> ledger_adapter.py hashes <unpacked wheel>

Its classes implement NeMo Gym's ``TokenSink`` (with ``begin_call``), ``TokenSource`` and
``LineageResolver`` protocols over our shipped client (``models/policy_model/ledger/client.py``, loaded
from the source tree with the wire models it sends: it needs only pydantic and httpx), which sends each
rollout to the replica its id hashes to among the given URLs. Every factory call makes a new client
with its own connections, so the suite's fresh-client checks talk to the servers, not to a cache.
Prints one JSON line: ``{"passed": [...]}`` or ``{"failed": check, "detail": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys


def suite(wheel: str, services: str, rollout_id: str, urls: list[str]) -> int:
    sys.path[:0] = [wheel, services]
    from nemo_gym.token_id_capture.conformance import ConformanceError, run_conformance
    from nemo_gym.token_id_capture.protocols import (
        LineageMatch,
        LineageResolution,
        LineageResolver,
        TokenCaptureSnapshot,
        TokenSink,
        TokenSource,
    )
    from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry

    from gym_services.models.policy_model.ledger.client import LedgerClient
    from gym_services.models.policy_model.ledger.wire import LedgerEntry

    class Adapter:
        def __init__(self) -> None:
            self.client = LedgerClient(urls)

        async def close(self) -> None:
            await self.client.close()

    class Sink(Adapter):
        async def put(self, entry: TokenEntry) -> None:
            await self.client.put(LedgerEntry.model_validate(entry.model_dump(mode="json")))

        async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
            await self.client.mark_incomplete(rollout_id, model_call_id)

        async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
            await self.client.begin_call(rollout_id, model_call_id)

    class Source(Adapter):
        async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
            frozen = await self.client.freeze(rollout_id)
            return TokenCaptureSnapshot(
                rollout_id=frozen.rollout_id,
                entries=tuple(TokenEntry.model_validate(e.model_dump(mode="json")) for e in frozen.entries),
                incomplete=frozen.incomplete,
                snapshot_id=frozen.snapshot_id,
                version=frozen.version,
            )

        async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
            return await self.client.drop(rollout_id, snapshot_id, version)

    class Lineage(Adapter):
        async def resolve(self, rollout_id: str, request_items: list[dict]) -> LineageResolution:
            found = await self.client.resolve(rollout_id, request_items)
            status = ParentResolutionStatus(found.status.value)
            if status != ParentResolutionStatus.RESOLVED:
                return LineageResolution(status, reason=found.reason)
            match = LineageMatch(
                model_call_id=str(found.model_call_id),
                cumulative_token_ids=tuple(found.cumulative_token_ids),
                digest=found.digest,
                prev_len=len(found.cumulative_token_ids),
            )
            return LineageResolution(status, match=match)

        def is_process_shared(self) -> bool:
            return True  # every client reaches the one replica that holds a rollout's ledger

    sink: type[TokenSink] = Sink
    source: type[TokenSource] = Source
    lineage: type[LineageResolver] = Lineage
    try:
        passed = asyncio.run(run_conformance(sink, source, lineage, rollout_id=rollout_id))
    except ConformanceError as exc:
        print(json.dumps({"failed": exc.check_name, "detail": exc.detail}))
        return 1
    print(json.dumps({"passed": passed}))
    return 0


def hashes(wheel: str) -> int:
    """The wheel's fingerprint and context digest of each item list read (JSON) from stdin."""
    sys.path[:0] = [wheel]
    from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint, conversation_digest

    cases = json.loads(sys.stdin.read())
    print(json.dumps([[assistant_fingerprint(items), conversation_digest(items)] for items in cases]))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "hashes":
        sys.exit(hashes(sys.argv[2]))
    sys.exit(suite(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
