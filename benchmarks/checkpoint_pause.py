"""Checkpoint pause and restore time versus live Workplace Assistant sessions, file:// and S3.

A real ``workplace_assistant`` uvicorn process holds N live sessions, each after a few mutating
tool calls. The coordinator takes a checkpoint (prepare -> commit -> publish -> resume); the
pause is what a rollout sees: from the first prepare to the last resume. Then a fresh process
restores it. S3 is a real SeaweedFS server on 127.0.0.1.

    .venv/bin/python benchmarks/checkpoint_pause.py [--sessions 10 100 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gym_services.coordination.client import ControlClient, ParticipantRef  # noqa: E402
from gym_services.coordination.coordinator import Coordinator  # noqa: E402
from gym_services.base.config import StorageConfig  # noqa: E402
from gym_services.stack.config import ServerSpec, StackConfig  # noqa: E402
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack  # noqa: E402
from tests.support.seaweed import start_seaweed  # noqa: E402

MUTATIONS = [
    ("email_send_email", {"recipient": "nadia.moreau@atlas.com", "subject": "Status", "body": "On track."}),
    ("calendar_create_event", {"event_name": "Sync", "participant_email": "nadia.moreau@atlas.com",
                               "event_start": "2023-12-01 10:00:00", "duration": "30"}),
    ("project_management_update_task", {"task_id": "00000000", "field": "list_name", "new_value": "Done"}),
]


async def seed_sessions(url: str, n: int) -> None:
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem, httpx.AsyncClient(base_url=url, timeout=60) as client:
            ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
            (await client.post("/seed_session", json={}, headers=ident)).raise_for_status()
            for name, args in MUTATIONS:
                (await client.post(f"/{name}", json=args, headers=ident)).raise_for_status()

    await asyncio.gather(*(one(i) for i in range(n)))


async def transaction(url: str, token: str, location: str, storage: StorageConfig, cid: str, restore: bool):
    async with ControlClient(token, timeout_s=300) as client:
        coordinator = Coordinator([ParticipantRef("workplace", "resources", url)], client, storage_config=storage)
        if restore:
            return await coordinator.restore(cid, location, lease_s=120)
        return await coordinator.checkpoint(cid, location, prepare_timeout_s=60, lease_s=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 100, 1000])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-bench-"))
    s3 = start_seaweed(tmp / "seaweed")
    s3.create_bucket("bench")
    env = s3.env()
    import os

    os.environ.update(env)  # the server processes and boto3 here reach SeaweedFS through AWS_*
    storage = StorageConfig(endpoint_url=s3.endpoint)
    rows = []
    try:
        for n in args.sessions:
            for backend, location in (("file", f"file://{tmp / 'store'}"), ("s3", f"s3://bench/n{n}")):
                stack = StackConfig(name="bench", state_dir=str(tmp / "stack"),
                                    servers={"workplace": ServerSpec(server="workplace_assistant")})
                token = stack_secrets(tmp / "stack")["control_token"]
                state = start_stack(stack, tmp, ready_timeout_s=60)
                url = state.servers[0].url
                try:
                    asyncio.run(seed_sessions(url, n))
                    cid = f"bench-{backend}-{n}"
                    result = asyncio.run(transaction(url, token, location, storage, cid, restore=False))
                    assert result.status == "completed", result.error
                finally:
                    stop_stack(tmp / "stack", kill=True)
                state = start_stack(stack, tmp, ready_timeout_s=60)
                try:
                    t0 = time.perf_counter()
                    restored = asyncio.run(transaction(state.servers[0].url, token, location, storage, cid, restore=True))
                    restore_s = time.perf_counter() - t0
                    assert restored.status == "completed", restored.error
                finally:
                    stop_stack(tmp / "stack", kill=True)
                rows.append((n, backend, result.pause_s, result.timings.get("commit", 0), result.bytes, result.records, restore_s))
    finally:
        s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("checkpoint pause and restore vs live Workplace sessions (3 mutating tool calls each)")
    print(f"{'sessions':>8} {'storage':>7} {'pause s':>8} {'commit s':>9} {'bytes':>10} {'B/session':>10} {'records':>8} {'restore s':>10}")
    for n, backend, pause, commit, size, records, restore_s in rows:
        print(f"{n:>8} {backend:>7} {pause:>8.3f} {commit:>9.3f} {size:>10} {size / n:>10.0f} {records:>8} {restore_s:>10.3f}")
    print("targets: pause <= 2 s (file) and <= 5 s (S3) at 1,000 sessions")


if __name__ == "__main__":
    main()
