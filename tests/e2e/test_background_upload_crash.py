"""SIGKILL during a checkpoint's background upload (the ``background`` method, docs/protocol.md, "Transactions").

The stack has resumed and every server is uploading its capture when everything dies: the
interrupted checkpoint must never be restorable (no global manifest, a restore of it refused and
installing nothing), and the previous checkpoint must restore exactly. The upload is held in
flight deterministically by freezing the real S3 server (SIGSTOP) until the stack is dead.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from tests.support.seaweed import start_seaweed

from gym_services.base.config import StorageConfig
from gym_services.control import layout
from gym_services.control.storage import open_storage
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, list_checkpoints
from gym_services.stack.config import ServerSpec, StackConfig
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e
NAMES = ("counter-0", "counter-1")


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "stack"
        self.config = StackConfig(
            name="crash", state_dir=str(self.dir), servers={n: ServerSpec(server="counter") for n in NAMES}
        )
        self.token = stack_secrets(self.dir)["control_token"]
        self.tmp = tmp
        self.state = None

    def start(self) -> Stack:
        self.state = start_stack(self.config, self.tmp)
        self.refs = [ParticipantRef(s.name, "resources", s.url) for s in self.state.servers]
        return self

    def url(self, name: str) -> str:
        return next(s.url for s in self.state.servers if s.name == name)

    def status(self, name: str) -> dict:
        return httpx.get(
            f"{self.url(name)}/ng-control/v1/checkpoint/status",
            headers={"authorization": f"Bearer {self.token}"},
            timeout=5,
        ).json()

    def stop(self) -> None:
        stop_stack(self.dir, kill=True)


def call(url: str, path: str, body: dict, cookies: dict, rollout: str, attempt: int) -> httpx.Response:
    with httpx.Client(base_url=url, cookies=cookies, timeout=10) as http:
        answer = http.post(path, json=body, headers={"x-ng-rollout-id": rollout, "x-ng-attempt": str(attempt)})
        answer.raise_for_status()
        # the server's Set-Cookie (for 127.0.0.1) wins over the cookie the client was given (no domain)
        cookies.update({c.name: c.value for c in http.cookies.jar if c.domain})
        return answer


def test_sigkill_during_background_upload_never_restores_it_and_restores_the_previous(tmp_path, monkeypatch) -> None:
    s3 = start_seaweed(tmp_path / "seaweed")
    frozen = False
    stack = fresh = None
    try:
        s3.create_bucket("crash")
        for key, value in s3.env().items():  # the servers started below reach SeaweedFS through AWS_*
            monkeypatch.setenv(key, value)
        storage = StorageConfig(endpoint_url=s3.endpoint)
        location = "s3://crash/ckpt"
        stack = Stack(tmp_path).start()
        cookies = {name: {} for name in NAMES}
        for i, name in enumerate(NAMES):
            call(stack.url(name), "/seed_session", {"start": 10 * i}, cookies[name], f"r{i}", 0)
            call(stack.url(name), "/increment", {"by": 1}, cookies[name], f"r{i}", 0)  # 1, 11 in ck-1

        killers: list[asyncio.Task] = []

        async def checkpoint(cid: str, on_event=None):
            async with ControlClient(stack.token, timeout_s=20) as client:
                coordinator = Coordinator(stack.refs, client, storage_config=storage, on_event=on_event)
                result = await coordinator.checkpoint(cid, location, prepare_timeout_s=5, lease_s=5)
                await asyncio.gather(*killers)
                return result

        first = asyncio.run(checkpoint("ck-1"))
        assert first.status == "completed" and first.method == "background", first.error
        for i, name in enumerate(NAMES):
            call(stack.url(name), "/increment", {"by": 100}, cookies[name], f"r{i}", 0)  # 101, 111 in ck-2

        seen: dict[str, dict] = {}

        async def kill_while_uploading() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                seen.update({name: stack.status(name) for name in NAMES})
                if all((s.get("persist") or {}).get("state") == "persisting" for s in seen.values()):
                    break
                await asyncio.sleep(0.05)
            stack.stop()  # SIGKILL every server: the crash
            thaw()  # the abort that follows clears what it can reach (frozen, each S3 call would wait out its timeout)

        def thaw() -> None:
            nonlocal frozen
            if frozen:
                os.kill(s3.process.pid, signal.SIGCONT)
                frozen = False

        async def crash_while_uploading(phase: str, detail: dict) -> None:
            nonlocal frozen
            if phase != "Persisting":
                return
            # resumed; the coordinator's persist starts every upload: hold them in flight, then kill everything
            os.kill(s3.process.pid, signal.SIGSTOP)
            frozen = True
            killers.append(asyncio.create_task(kill_while_uploading()))

        second = asyncio.run(checkpoint("ck-2", crash_while_uploading))
        assert not frozen
        assert all(s["admission_open"] and s["persist"]["state"] == "persisting" for s in seen.values()), seen
        assert second.status == "failed", second
        store = open_storage(location, storage)
        assert not store.exists(layout.global_manifest_key("ck-2"))
        found = dict(list_checkpoints(location, storage))
        assert found["ck-1"] is not None and found.get("ck-2") is None  # ck-2 is incomplete (or absent)

        fresh = Stack(tmp_path).start()

        async def restore(cid: str):
            async with ControlClient(fresh.token, timeout_s=20) as client:
                return await Coordinator(fresh.refs, client, storage_config=storage).restore(cid, location, lease_s=5)

        refused = asyncio.run(restore("ck-2"))
        assert refused.status == "failed" and "ck-2" in (refused.error or ""), refused
        assert all(fresh.status(n)["live"] == {"sessions": 0} for n in NAMES)  # nothing installed
        restored = asyncio.run(restore("ck-1"))
        assert restored.status == "completed", restored.error
        assert restored.episodes == {"r0": 1, "r1": 1}
        for i, name in enumerate(NAMES):  # exactly ck-1's state: the values before the +100
            value = call(fresh.url(name), "/increment", {"by": 0}, cookies[name], f"r{i}", 1).json()["output"]
            assert value == 10 * i + 1, (name, value)
    finally:
        if frozen:
            os.kill(s3.process.pid, signal.SIGCONT)
        for running in (stack, fresh):
            if running is not None and running.state is not None:
                running.stop()
        s3.stop()
