"""Faults at every protocol step never leave a partial checkpoint or a partial restore, and the stack
always ends with admission open (docs/architecture.md, "Targets"). Real counter processes, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gym_services.control import layout
from gym_services.control.models import CheckpointRef, RestoreRequest
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator, list_checkpoints
from gym_services.stack.config import ServerSpec, StackConfig
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e
NAMES = ("counter-0", "counter-1", "counter-2")


class Servers:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "stack"
        self.config = StackConfig(
            name="faults", state_dir=str(self.dir), servers={n: ServerSpec(server="counter") for n in NAMES}
        )
        self.token = stack_secrets(self.dir)["control_token"]
        self.tmp = tmp

    def start(self):
        self.state = start_stack(self.config, self.tmp)
        self.refs = [ParticipantRef(s.name, "resources", s.url) for s in self.state.servers]
        return self

    def seed(self) -> None:
        for i, server in enumerate(self.state.servers):
            with httpx.Client(base_url=server.url) as http:
                http.post("/seed_session", json={"start": i}, headers={"x-ng-rollout-id": f"r{i}"}).raise_for_status()

    def kill(self, name: str) -> None:
        pid = next(s.pid for s in self.state.servers if s.name == name)
        os.killpg(pid, signal.SIGKILL)

    def lease_expiries(self) -> dict[str, float]:
        """Each server's ``gym_checkpoint_lease_expiries_total``: checkpoints it aborted because its lease ran out."""
        out = {}
        for s in self.state.servers:
            text = httpx.get(f"{s.url}/metrics", timeout=5).text
            out[s.name] = sum(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("gym_checkpoint_lease_expiries_total")
            )
        return out

    def statuses(self) -> dict[str, dict]:
        out = {}
        for s in self.state.servers:
            try:
                out[s.name] = httpx.get(
                    f"{s.url}/ng-control/v1/checkpoint/status",
                    headers={"authorization": f"Bearer {self.token}"},
                    timeout=5,
                ).json()
            except httpx.HTTPError:
                out[s.name] = {"dead": True}
        return out

    def stop(self) -> None:
        stop_stack(self.dir, kill=True)


async def run_checkpoint(
    servers: Servers,
    location: str,
    kill_at: str,
    victim: str = "counter-1",
    method: str = "background",
    cid: str = "ck",
):
    async with ControlClient(servers.token, timeout_s=10) as client:

        async def on_event(phase: str, detail: dict) -> None:
            if phase == kill_at:
                servers.kill(victim)
                await asyncio.sleep(0.2)

        coordinator = Coordinator(servers.refs, client, on_event=on_event)
        return await coordinator.checkpoint(cid, location, prepare_timeout_s=3, lease_s=2, method=method)


@pytest.mark.parametrize(
    ("method", "kill_at"),
    [
        ("sync", "Preparing"),
        ("sync", "Capturing"),
        ("sync", "Persisting"),
        ("sync", "Publishing"),
        ("background", "Preparing"),
        ("background", "Capturing"),
        ("background", "Persisting"),
        ("background", "Publishing"),
    ],
)
async def test_participant_killed_before_publish_leaves_no_checkpoint(tmp_path, method, kill_at) -> None:
    location = f"file://{tmp_path / 'store'}"
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        result = await run_checkpoint(servers, location, kill_at, method=method)
        statuses = servers.statuses()
    finally:
        servers.stop()
    if kill_at == "Publishing":
        # every participant had written its records: the manifest is published, the checkpoint is whole
        assert result.status == "completed", result.error
        if method == "sync":  # resumed after publishing: the dead one could not be resumed
            assert any("counter-1" in w for w in result.warnings)
        assert open_storage(location).exists(layout.global_manifest_key("ck"))
    else:
        assert result.status == "failed" and "counter-1" in result.error
        assert not open_storage(location).exists(layout.global_manifest_key("ck"))
        assert list_checkpoints(location) in ([], [("ck", None)])  # never a complete-looking partial one
    survivors = {k: v for k, v in statuses.items() if k != "counter-1"}
    assert all(s["admission_open"] and s["checkpoint_id"] is None for s in survivors.values()), survivors


async def test_participant_killed_while_resuming_checkpoint_is_whole_and_restorable(tmp_path) -> None:
    location = f"file://{tmp_path / 'store'}"
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        result = await run_checkpoint(servers, location, "Resuming", victim="counter-0", method="sync")
        assert result.status == "completed"
    finally:
        servers.stop()
    fresh = Servers(tmp_path).start()
    try:
        async with ControlClient(fresh.token) as client:
            restored = await Coordinator(fresh.refs, client).restore("ck", location)
        assert restored.status == "completed" and restored.episodes == {"r0": 1, "r1": 1, "r2": 1}
    finally:
        fresh.stop()


async def test_participant_killed_while_resuming_a_background_checkpoint_leaves_none(tmp_path) -> None:
    """background: resume comes before the records are written; a server dead at resume never writes
    its capture, so nothing is published and the survivors serve again."""
    location = f"file://{tmp_path / 'store'}"
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        result = await run_checkpoint(servers, location, "Resuming", victim="counter-0", method="background")
        statuses = servers.statuses()
    finally:
        servers.stop()
    assert result.status == "failed" and "counter-0" in result.error
    assert not open_storage(location).exists(layout.global_manifest_key("ck"))
    survivors = {k: v for k, v in statuses.items() if k != "counter-0"}
    assert all(s["admission_open"] and s["checkpoint_id"] is None for s in survivors.values()), survivors


async def test_participant_killed_during_restore_installs_nothing_anywhere(tmp_path) -> None:
    location = f"file://{tmp_path / 'store'}"
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        assert (await run_checkpoint(servers, location, kill_at="never")).status == "completed"
    finally:
        servers.stop()
    fresh = Servers(tmp_path).start()
    try:
        async with ControlClient(fresh.token, timeout_s=10) as client:

            async def on_event(phase: str, detail: dict) -> None:
                if phase == "Restoring":
                    fresh.kill("counter-2")

            restored = await Coordinator(fresh.refs, client, on_event=on_event).restore("ck", location, lease_s=2)
        statuses = fresh.statuses()
    finally:
        fresh.stop()
    assert restored.status == "failed" and "counter-2" in restored.error
    survivors = [statuses[n] for n in ("counter-0", "counter-1")]
    assert all(s["phase"] == "fresh" and s["live"] == {"sessions": 0} and s["admission_open"] for s in survivors), (
        survivors
    )


@pytest.mark.parametrize(
    ("method", "kill_at"),
    [
        ("sync", "preparing"),
        ("sync", "capturing"),
        ("sync", "persisting"),
        ("sync", "publishing"),
        ("sync", "resuming"),
        ("background", "capturing"),
        ("background", "resuming"),
        ("background", "persisting"),
        ("background", "publishing"),
    ],
)
def test_coordinator_killed_mid_transaction(tmp_path, method, kill_at) -> None:
    """SIGKILL the `gymckpt checkpoint` process as it enters a phase: the checkpoint is published whole
    or not at all, and within the lease every server has reopened admission by itself."""
    location = f"file://{tmp_path / 'store'}"
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        env = {**os.environ, "GYMCKPT_STATE_DIR": str(servers.dir), "PYTHONUNBUFFERED": "1"}
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gym_services.cli",
                "checkpoint",
                "--id",
                "ck",
                "--storage",
                location,
                "--lease",
                "1",
                "--method",
                method,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert cli.stdout is not None
        seen = []
        for line in cli.stdout:  # progress lines: "  HH:MM:SS <phase>"
            seen.append(line.strip())
            if line.strip().endswith(kill_at):
                os.killpg(cli.pid, signal.SIGKILL)
                break
        cli.communicate(timeout=10)  # waits, and closes its stdout
        assert seen and seen[-1].endswith(kill_at), seen
        paused_right_after = [n for n, st in servers.statuses().items() if not st["admission_open"]]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(st["admission_open"] for st in servers.statuses().values()):
            time.sleep(0.1)
        statuses = servers.statuses()
        expiries = servers.lease_expiries()
        published = open_storage(location).exists(layout.global_manifest_key("ck"))
    finally:
        servers.stop()
    if kill_at == "capturing" or (method == "sync" and kill_at in ("persisting", "publishing")):
        # every participant was prepared when the coordinator died: each reopened by its lease running out (its
        # counter, not a look at admission right after the kill: on a busy machine a 1 s lease can be over by then),
        # unless the coordinator got as far as resuming it first (a busy test reads the phase line late: the
        # coordinator can capture and resume in the meantime). Either way nobody is left paused.
        reopened = {
            n: "lease"
            if expiries.get(n, 0) >= 1
            else "resume"
            if (st.get("last_event") or "").startswith("resume ck")
            else None
            for n, st in statuses.items()
        }
        assert expiries and all(reopened.values()), (expiries, reopened, paused_right_after)
    assert all(st["admission_open"] and st["checkpoint_id"] is None for st in statuses.values()), statuses
    if kill_at in ("preparing", "capturing", "persisting") or (method == "background" and kill_at == "resuming"):
        # background: nobody publishes what the dead coordinator captured, even once every upload is done
        assert not published and list_checkpoints(location) in ([], [("ck", None)])
    if method == "sync" and kill_at == "resuming":
        assert published
    if published:
        fresh = Servers(tmp_path).start()
        try:

            async def restore():
                async with ControlClient(fresh.token) as client:
                    return await Coordinator(fresh.refs, client).restore("ck", location)

            assert asyncio.run(restore()).status == "completed"
        finally:
            fresh.stop()


def checkpoint_of_three(tmp_path: Path, location: str) -> None:
    servers = Servers(tmp_path).start()
    try:
        servers.seed()
        assert asyncio.run(run_checkpoint(servers, location, kill_at="never")).status == "completed"
    finally:
        servers.stop()


async def restore_without_deciding(servers: Servers, client: ControlClient, location: str, restore_id: str) -> None:
    """What a coordinator does up to the moment it dies before writing the decision: every participant restored."""
    storage = open_storage(location)
    manifest = json.loads(storage.get(layout.global_manifest_key("ck")))
    for entry in manifest["participants"]:
        ref = next(r for r in servers.refs if r.participant_id == entry["participant_id"])
        answer = await client.restore(
            ref,
            RestoreRequest(
                checkpoint_id="ck",
                location=location,
                manifest_key=entry["manifest_key"],
                manifest_sha256=entry["manifest_sha256"],
                lease_s=1,
                restore_id=restore_id,
            ),
        )
        assert answer.records == 1


def wait_all_open(servers: Servers, timeout_s: float = 10) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = servers.statuses()
        if all(st.get("admission_open") and st.get("checkpoint_id") is None for st in statuses.values()):
            return statuses
        time.sleep(0.1)
    raise AssertionError(f"servers did not reopen: {servers.statuses()}")


def run_then_wait_open(servers: Servers, body) -> dict[str, dict]:
    """Run ``body(client)`` against the servers as a coordinator that then dies; wait until all reopen."""

    async def go():
        async with ControlClient(servers.token) as client:
            await body(client)

    asyncio.run(go())
    return wait_all_open(servers)


@pytest.mark.parametrize("resumed_before_death", [0, 1, 2])
def test_coordinator_dead_after_deciding_a_restore_leaves_it_installed_everywhere(
    tmp_path, resumed_before_death
) -> None:
    """The coordinator wrote `resume` and resumed 0, 1 or 2 of 3 servers, then died: the others'
    leases run out, they read the decision and resume too. Nobody undoes the restore."""
    location = f"file://{tmp_path / 'store'}"
    checkpoint_of_three(tmp_path, location)
    fresh = Servers(tmp_path).start()
    try:

        async def die_halfway(client: ControlClient) -> None:
            await restore_without_deciding(fresh, client, location, "rs-1")
            assert CheckpointStore(open_storage(location)).settle("ck", "rs-1", "resume", "coordinator") == "resume"
            for ref in fresh.refs[:resumed_before_death]:
                await client.resume(ref, CheckpointRef(checkpoint_id="ck"))

        statuses = run_then_wait_open(fresh, die_halfway)
        metrics = httpx.get(f"{fresh.state.servers[-1].url}/metrics").text  # never resumed by the coordinator
    finally:
        fresh.stop()
    assert all(st["phase"] == "open" and st["live"] == {"sessions": 1} for st in statuses.values()), statuses
    assert CheckpointStore(open_storage(location)).decision("ck", "rs-1") == "resume"
    assert 'gym_checkpoint_restore_decisions_total{decision="resume"} 1.0' in metrics


def test_coordinator_dead_before_deciding_a_restore_leaves_it_installed_nowhere(tmp_path) -> None:
    location = f"file://{tmp_path / 'store'}"
    checkpoint_of_three(tmp_path, location)
    fresh = Servers(tmp_path).start()
    try:
        statuses = run_then_wait_open(fresh, lambda client: restore_without_deciding(fresh, client, location, "rs-2"))

        async def late_coordinator():  # the same restore repeated later is refused: it was abandoned
            async with ControlClient(fresh.token) as client:
                return await Coordinator(fresh.refs, client).restore("ck", location, restore_id="rs-2")

        repeated = asyncio.run(late_coordinator())
    finally:
        fresh.stop()
    assert all(st["phase"] == "fresh" and st["live"] == {"sessions": 0} for st in statuses.values()), statuses
    assert CheckpointStore(open_storage(location)).decision("ck", "rs-2") == "abort"
    assert repeated.status == "failed" and "abandoned" in (repeated.error or "")


def test_restore_cli_killed_while_resuming_ends_restored_everywhere(tmp_path) -> None:
    """SIGKILL `gymckpt restore` as it starts resuming: the decision is already written, so every
    server ends resumed with the restored sessions, whichever ones the CLI reached."""
    location = f"file://{tmp_path / 'store'}"
    checkpoint_of_three(tmp_path, location)
    fresh = Servers(tmp_path).start()
    try:
        env = {**os.environ, "GYMCKPT_STATE_DIR": str(fresh.dir), "PYTHONUNBUFFERED": "1"}
        cli = subprocess.Popen(
            [sys.executable, "-m", "gym_services.cli", "restore", "ck", "--storage", location, "--lease", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert cli.stdout is not None
        seen = []
        for line in cli.stdout:
            seen.append(line.strip())
            if line.strip().endswith("resuming"):
                os.killpg(cli.pid, signal.SIGKILL)
                break
        cli.communicate(timeout=10)  # waits, and closes its stdout
        assert seen and seen[-1].endswith("resuming"), seen
        statuses = wait_all_open(fresh)
    finally:
        fresh.stop()
    assert all(st["phase"] == "open" and st["live"] == {"sessions": 1} for st in statuses.values()), statuses
