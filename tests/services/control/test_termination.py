"""A terminating server and final checkpoints over ASGI (``docs/protocol.md``, "Termination"): the status long-poll,
a final checkpoint held and never resumed (by ``resume`` or by its lease), the termination released once its part is
persisted, an abort that reopens it. The signal itself (SIGTERM to ``gymckpt serve``) is the e2e tests' business."""

from __future__ import annotations

import asyncio
import time

from tests.services.control.test_control_plane import make_app
from tests.support.asgi import Control, serve

from gym_services.control.termination import ExitReason


async def _status_after(control: Control, wait_s: float) -> tuple[float, dict]:
    started = time.monotonic()
    resp = await control.client.get(
        f"{control.prefix}/status", params={"wait_terminating_s": wait_s}, headers=control.headers
    )
    assert resp.status_code == 200, resp.text
    return time.monotonic() - started, resp.json()


async def test_status_long_poll_answers_at_the_signal() -> None:
    app, *_ = make_app(checkpoint={"termination_grace_s": 20})
    termination = app.state.plane.termination
    async with serve(app) as client:
        control = Control(client)
        waited, status = await _status_after(control, 0.2)  # nobody signalled: answered after the wait
        assert waited >= 0.2 and status["terminating"] is None
        poll = asyncio.create_task(_status_after(control, 30))
        await asyncio.sleep(0.1)
        assert not poll.done()
        termination.begin("SIGTERM")
        waited, status = await asyncio.wait_for(poll, 5)
        assert waited < 5
        term = status["terminating"]
        assert term["signal"] == "SIGTERM" and term["grace_s"] == 20 and 19 < term["left_s"] <= 20
        assert term["deadline_at"] - term["signalled_at"] == 20 and term["final_checkpoint_id"] is None
        assert not termination.begin("SIGTERM")  # a second signal keeps the deadline
        bad = await client.get(f"{control.prefix}/status", params={"wait_terminating_s": "x"}, headers=control.headers)
        assert bad.status_code == 400 and "wait_terminating_s" in bad.json()["error"]["message"]


async def test_a_final_checkpoint_is_held_and_releases_the_termination(tmp_path) -> None:
    app, participant, state, _gate = make_app(checkpoint={"termination_grace_s": 20})
    termination = app.state.plane.termination
    async with serve(app) as client:
        control = Control(client)
        termination.begin("SIGTERM")
        assert termination.exit_due() is None  # terminating, but holding its state for the final checkpoint
        assert (await client.post("/bump")).status_code == 200  # and serving until the checkpoint pauses it
        prepared = await control.call("prepare", {"checkpoint_id": "f1", "deadline_s": 5, "final": True})
        assert prepared["status"] == "prepared"
        await control.capture("f1", f"file://{tmp_path}")
        persisted = await control.persist("f1")
        assert persisted["records"] == 0
        status = await control.status()
        assert status["phase"] == "final" and not status["admission_open"]
        assert status["terminating"]["final_checkpoint_id"] == "f1"
        assert termination.exit_due() is ExitReason.FINAL_PERSISTED
        refused = await client.post("/bump")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "checkpoint_parked"
        assert state["value"] == 1 and participant.events == ["prepare f1"]  # never resumed


async def test_a_checkpoint_prepared_while_terminating_is_final_and_resume_holds_it(tmp_path) -> None:
    """A coordinator that does not know of the termination (no ``final``, the snapshot method's resume then persist):
    the server holds the checkpoint anyway; ``resume`` starts its upload without reopening admission."""
    app, participant, _state, _gate = make_app(checkpoint={"termination_grace_s": 20})
    termination = app.state.plane.termination
    async with serve(app) as client:
        control = Control(client)
        termination.begin("SIGTERM")
        await control.prepare("c1")
        await control.capture("c1", f"file://{tmp_path}")
        held = await control.resume("c1")
        assert held["phase"] == "captured" and "not resumed" in held["detail"]
        assert (await client.post("/bump")).status_code == 409
        await control.persist("c1")
        for _ in range(100):
            if (await control.status())["phase"] == "final":
                break
            await asyncio.sleep(0.01)
        assert (await control.status())["phase"] == "final"
        assert termination.exit_due() is ExitReason.FINAL_PERSISTED
        assert participant.events == ["prepare c1"]


async def test_a_final_checkpoints_lease_ends_the_process_never_resumes_it(tmp_path) -> None:
    """A participant that was not signalled (another server of the stack was) holds the final checkpoint; when nobody
    renews its lease any more it asks to exit, and admission stays closed."""
    app, participant, _state, _gate = make_app(checkpoint={"termination_grace_s": 20})
    termination = app.state.plane.termination
    async with serve(app) as client:
        control = Control(client)
        prepared = await control.call(
            "prepare", {"checkpoint_id": "f1", "deadline_s": 5, "lease_s": 1.0, "final": True}
        )
        assert prepared["status"] == "prepared"
        await control.capture_persist("f1", f"file://{tmp_path}")
        assert termination.exit_due() is None  # not terminating: it holds
        await asyncio.sleep(1.5)  # the lease runs out
        status = await control.status()
        assert status["phase"] == "final" and not status["admission_open"]
        assert termination.exit_due() is ExitReason.FINAL_HELD
        assert participant.events == ["prepare f1"]


async def test_aborting_a_final_checkpoint_reopens_it(tmp_path) -> None:
    """The publish failed: the coordinator aborts, the server serves again and no longer counts the checkpoint."""
    app, participant, _state, _gate = make_app(checkpoint={"termination_grace_s": 20})
    termination = app.state.plane.termination
    async with serve(app) as client:
        control = Control(client)
        await control.call("prepare", {"checkpoint_id": "f1", "deadline_s": 5, "final": True})
        await control.capture_persist("f1", f"file://{tmp_path}")
        assert (await control.status())["phase"] == "final"
        await control.abort("f1")
        assert (await control.status())["phase"] == "open"
        assert (await client.post("/bump")).status_code == 200
        assert termination.exit_due() is None and termination.final_checkpoint_id is None
        assert participant.events == ["prepare f1", "abort"]


async def test_a_participant_holding_the_checkpoint_as_final_makes_it_final_for_all(tmp_path) -> None:
    """A scheduled checkpoint whose prepare reaches a server after its termination signal: that server holds it as
    final, and the coordinator then takes the whole checkpoint as final, so no participant works past the cut."""
    from tests.support.asgi import TOKEN, MultiASGITransport

    from gym_services.coordination.client import ControlClient, ParticipantRef
    from gym_services.coordination.coordinator import Coordinator

    signalled, s_participant, _, _ = make_app(checkpoint={"termination_grace_s": 20, "participant_id": "signalled"})
    other, o_participant, _, _ = make_app(checkpoint={"termination_grace_s": 20, "participant_id": "other"})
    async with serve(signalled), serve(other):
        signalled.state.plane.termination.begin("SIGTERM")
        refs = [
            ParticipantRef("signalled", "environment", "http://signalled"),
            ParticipantRef("other", "agent", "http://other"),
        ]
        transport = MultiASGITransport({"signalled": signalled, "other": other})
        async with ControlClient(TOKEN, transport=transport) as client:
            result = await Coordinator(refs, client).checkpoint("c1", f"file://{tmp_path}")  # the snapshot method
            assert result.completed and result.final, result.error
            for ref in refs:
                status = await client.status(ref)
                assert status.phase == "final" and not status.admission_open, (ref, status.phase)
    assert s_participant.events == ["prepare c1"] and o_participant.events == ["prepare c1"]  # nobody resumed
    assert signalled.state.plane.termination.exit_due() is not None  # the signalled one exits
    assert other.state.plane.termination.exit_due() is None  # the other holds until its lease runs out


async def test_a_server_prepared_before_its_signal_holds_a_checkpoint_that_became_final(tmp_path) -> None:
    """The agent prepared a scheduled checkpoint, then got SIGTERM; a server prepared after its own signal made the
    checkpoint final: the capture tells the agent, which holds it too and exits once its part is written (it would
    otherwise wait for its deadline, and reopen on its lease)."""
    from tests.support.asgi import TOKEN, MultiASGITransport

    from gym_services.coordination.client import ControlClient, ParticipantRef
    from gym_services.coordination.coordinator import Coordinator

    early, e_participant, _, _ = make_app(checkpoint={"termination_grace_s": 20, "participant_id": "early"})
    late, _, _, _ = make_app(checkpoint={"termination_grace_s": 20, "participant_id": "late"})
    early.state.plane.final.begin = _then_signal(early.state.plane.final.begin, early.state.plane.termination)
    late.state.plane.termination.begin("SIGTERM")
    async with serve(early), serve(late):
        refs = [ParticipantRef("early", "model", "http://early"), ParticipantRef("late", "resources", "http://late")]
        transport = MultiASGITransport({"early": early, "late": late})
        async with ControlClient(TOKEN, transport=transport) as client:
            result = await Coordinator(refs, client).checkpoint("c1", f"file://{tmp_path}")
            assert result.completed and result.final, result.error
            assert (await client.status(refs[0])).phase == "final"
    assert e_participant.events == ["prepare c1"]
    assert early.state.plane.termination.exit_due() is not None  # its part is written: it exits now


def _then_signal(begin, termination):
    """``FinalHold.begin`` at the prepare, then the server's SIGTERM (it arrives just after the prepare)."""

    def wrapped(checkpoint_id: str, asked: bool) -> None:
        begin(checkpoint_id, asked)
        if not termination.active:
            termination.begin("SIGTERM")

    return wrapped
