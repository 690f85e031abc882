"""A capture's frozen records are encoded by their participant's encoder in a forked child (off the serving
process's GIL), with the same bytes as in the thread; the encodings cache is still filled in the serving process."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable

import pytest
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import load_config
from gym_services.control import encoding
from gym_services.control.encoding import FORK_MIN_RECORDS, PersistCancelled, encode_frozen
from gym_services.control.participant import FrozenRecord, InvalidState, Record, Scope
from gym_services.resources.workplace_assistant.app import Config, create_app

PARENT = os.getpid()


def where(i: int) -> bytes:
    return f"{i}:{os.getpid()}".encode()


class Encoder:
    """A record encoder over ``encode(i)``, the frozen state of record ``r<i>`` being ``i``."""

    def __init__(self, encode: Callable[[int], bytes] = where) -> None:
        self.made = encode

    def encode(self, state: int) -> bytes:
        return self.made(state)

    def encoded(self, state: int, data: bytes) -> None:
        pass


def frozen(n: int) -> list[FrozenRecord[int]]:
    return [FrozenRecord(key=f"r{i}", state=i) for i in range(n)]


def test_many_records_are_encoded_in_a_child_few_in_the_thread() -> None:
    forked = encode_frozen(Encoder(), frozen(FORK_MIN_RECORDS + 10), threading.Event())
    assert [b.split(b":")[0] for b in forked] == [str(i).encode() for i in range(FORK_MIN_RECORDS + 10)]
    assert {b.split(b":")[1] for b in forked} != {str(PARENT).encode()}  # another process made them
    few = encode_frozen(Encoder(), frozen(3), threading.Event())
    assert few == [f"{i}:{PARENT}".encode() for i in range(3)]


def test_a_server_with_more_than_1024_descriptors_still_encodes_in_a_child() -> None:
    """A server with thousands of connections (an agent running a thousand episodes) has descriptors past select()'s
    1024: the child's pipe is one of them (select() refused it: "filedescriptor out of range")."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        forked = encode_frozen(Encoder(), frozen(FORK_MIN_RECORDS + 1), threading.Event())
    finally:
        for fd in held:
            os.close(fd)
    assert len(forked) == FORK_MIN_RECORDS + 1 and {b.split(b":")[1] for b in forked} != {str(PARENT).encode()}


def test_a_large_capture_is_split_over_children_in_order() -> None:
    n = 2 * FORK_MIN_RECORDS + 7
    made = encode_frozen(Encoder(), frozen(n), threading.Event(), processes=2)
    assert [b.split(b":")[0] for b in made] == [str(i).encode() for i in range(n)]
    pids = [b.split(b":")[1] for b in made]
    assert len(set(pids)) == 2 and str(PARENT).encode() not in pids  # two children, one contiguous share each
    assert pids[: n // 2] == [pids[0]] * (n // 2) and pids[n // 2 :] == [pids[-1]] * (n - n // 2)
    # never more children than shares of FORK_MIN_RECORDS
    assert (
        len({b.split(b":")[1] for b in encode_frozen(Encoder(), frozen(FORK_MIN_RECORDS + 1), threading.Event(), 4)})
        == 1
    )


def test_the_processes_default_to_one_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMCKPT_ENCODE_PROCESSES", raising=False)
    assert encoding.encode_processes() == 1
    monkeypatch.setenv("GYMCKPT_ENCODE_PROCESSES", "3")
    assert encoding.encode_processes() == 3
    monkeypatch.setenv("GYMCKPT_ENCODE_PROCESSES", "99")
    assert encoding.encode_processes() == encoding.MAX_PROCESSES


def test_the_serving_process_forks_once_however_many_children_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fork copies the serving process's page tables with the GIL held: the first child forks the others."""
    forks_here = []
    real_fork = os.fork

    def fork() -> int:
        if os.getpid() == PARENT:
            forks_here.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    made = encode_frozen(Encoder(), frozen(3 * FORK_MIN_RECORDS), threading.Event(), processes=3)
    assert len({b.split(b":")[1] for b in made}) == 3
    assert forks_here == [1]


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_cancel_kills_every_child(tmp_path) -> None:
    """A child forked by the first child hangs: cancelling kills it too (one process group), not only the first."""

    def hangs_in_the_second_share(i: int) -> bytes:
        if i == FORK_MIN_RECORDS + 5 and os.getpid() != PARENT:
            (tmp_path / "hung").write_text(str(os.getpid()))
            threading.Event().wait()
        return b"x"

    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)
    timer.start()
    try:
        with pytest.raises(PersistCancelled):
            encode_frozen(Encoder(hangs_in_the_second_share), frozen(2 * FORK_MIN_RECORDS), cancel, processes=2)
    finally:
        timer.cancel()
    hung = int((tmp_path / "hung").read_text())
    for _ in range(100):  # SIGKILL is delivered asynchronously: up to 5 s
        if not running(hung):
            break
        threading.Event().wait(0.05)
    assert not running(hung)


def niceness(i: int) -> bytes:
    return f"{i}:{os.getpriority(os.PRIO_PROCESS, 0)}".encode()


def test_children_run_at_a_lower_priority_than_the_serving_process() -> None:
    made = encode_frozen(Encoder(niceness), frozen(2 * FORK_MIN_RECORDS), threading.Event(), processes=2)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert {int(b.split(b":")[1]) for b in made} == {min(19, mine + encoding.CHILD_NICE)}
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def frozen_count(i: int) -> bytes:
    return f"{i}:{gc.get_freeze_count()}".encode()


def test_the_heap_is_frozen_from_the_collector_while_children_encode() -> None:
    """Objects that existed at the fork sit in the permanent generation while the children live (a collection in
    the serving process would write every page it shares with them), and go back to the collector afterwards."""
    assert gc.get_freeze_count() == 0
    made = encode_frozen(Encoder(frozen_count), frozen(2 * FORK_MIN_RECORDS), threading.Event(), processes=2)
    assert all(int(b.split(b":")[1]) > 1000 for b in made)  # what the children saw, frozen before the fork
    assert gc.get_freeze_count() == 0


def test_heap_holds_compose_and_the_last_release_unfreezes() -> None:
    """A capture's hold (taken at its end, released when its persist ends) spans the encode's own: the encode ending
    leaves the heap frozen, and a repeated release neither unfreezes twice nor ends another holder's hold."""
    assert gc.get_freeze_count() == 0
    capture = encoding.HeapHold()
    try:
        made = encode_frozen(Encoder(frozen_count), frozen(FORK_MIN_RECORDS), threading.Event(), processes=1)
        assert all(int(b.split(b":")[1]) > 1000 for b in made)
        assert gc.get_freeze_count() > 0  # the encode ended; the capture still holds
        other = encoding.HeapHold()
        capture.release()
        capture.release()  # idempotent: not a release of ``other``'s hold
        assert gc.get_freeze_count() > 0
        other.release()
        assert gc.get_freeze_count() == 0
    finally:
        capture.release()


def dies_in_the_second_child(i: int) -> bytes:
    if i == FORK_MIN_RECORDS + 10 and os.getpid() != PARENT:
        os._exit(3)
    return f"{i}:{os.getpid()}".encode()


def test_a_child_that_dies_leaves_only_its_share_to_the_thread() -> None:
    n = 2 * FORK_MIN_RECORDS
    made = encode_frozen(Encoder(dies_in_the_second_child), frozen(n), threading.Event(), processes=2)
    assert [b.split(b":")[0] for b in made] == [str(i).encode() for i in range(n)]
    pids = [b.split(b":")[1] for b in made]
    assert str(PARENT).encode() not in pids[:FORK_MIN_RECORDS]
    assert set(pids[FORK_MIN_RECORDS:]) == {str(PARENT).encode()}


def fails_at_70(i: int) -> bytes:
    if i == 70:
        raise ValueError("no such column")
    return b"x"


def test_a_record_that_cannot_be_encoded_is_named() -> None:
    with pytest.raises(InvalidState, match=r"record r70 cannot be encoded: ValueError: no such column"):
        encode_frozen(Encoder(fails_at_70), frozen(100), threading.Event())


def test_cancel_stops_the_child() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PersistCancelled):
        encode_frozen(Encoder(), frozen(100), cancel)


def hangs_in_the_child(i: int) -> bytes:
    if i == 70 and os.getpid() != PARENT:
        threading.Event().wait()  # a deadlocked encoder
    return b"x"


def test_a_hanging_child_is_killed_when_the_checkpoint_is_cancelled() -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)  # the coordinator aborts at its persist deadline
    timer.start()
    try:
        with pytest.raises(PersistCancelled):
            encode_frozen(Encoder(hangs_in_the_child), frozen(100), cancel)  # returns: the child was killed and reaped
    finally:
        timer.cancel()


def dies_in_the_child(i: int) -> bytes:
    if i == 70 and os.getpid() != PARENT:
        os._exit(3)  # the child dies (as if killed by the OOM killer)
    return f"{i}".encode()


def test_a_child_that_dies_is_replaced_by_the_thread() -> None:
    made = encode_frozen(Encoder(dies_in_the_child), frozen(100), threading.Event())
    assert made == [str(i).encode() for i in range(100)]


async def test_workplace_bytes_match_and_the_cache_is_filled_in_the_server(tmp_path) -> None:
    """80 real Workplace sessions: forked bytes equal the thread's; after a checkpoint written by a child, the
    participant knows every session's bytes, so the next capture re-encodes only the changed one."""
    app = create_app(load_config(Config, overrides=base_config("workplace_assistant")))
    participant = app.state.participant
    async with serve(app) as client:
        for i in range(FORK_MIN_RECORDS + 16):
            client.cookies.clear()
            ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
            assert (await client.post("/seed_session", json={}, headers=ident)).status_code == 200
            body = {"recipient": "nadia.moreau@atlas.com", "subject": f"n{i}", "body": "b"}
            assert (await client.post("/email_send_email", json=body, headers=ident)).status_code == 200
        capture = await participant.capture(Scope.of(None))
        items = [r for r in capture.records if isinstance(r, FrozenRecord)]
        assert len(items) > FORK_MIN_RECORDS
        encoder = participant.encoder
        assert encode_frozen(encoder, items, threading.Event()) == [encoding.encode_one(encoder, r) for r in items]

        participant.session_encoder.encodings = {}  # as a fresh server: nothing cached
        control = Control(client)
        await control.checkpoint_background("ck1", f"file://{tmp_path / 'store'}")
        sessions = FORK_MIN_RECORDS + 16
        assert (
            len(participant.session_encoder.encodings) == sessions
        )  # kept in this process, though a child encoded them
        assert (
            await client.post(
                "/email_send_email",
                json={"recipient": "a@b.c", "subject": "s", "body": "b"},
                headers={"x-ng-rollout-id": f"r{sessions - 1}", "x-ng-attempt": "0"},
            )
        ).status_code == 200
        again = await participant.capture(Scope.of(None))
        sessions_pending = [
            r.key for r in again.records if isinstance(r, FrozenRecord) and r.key.startswith("session-")
        ]
        assert len(sessions_pending) == 1
        assert sum(isinstance(r, Record) and r.key.startswith("session-") for r in again.records) == sessions - 1
