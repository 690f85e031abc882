"""Leader election (gym_operator.leadership) against the Kubernetes API emulator: the Kubernetes Lease is taken only
when free or unrenewed for the leadership's duration, every write is conditional, a leader that cannot renew gives it
up, a released Lease is taken at once. Each candidate's clock is a hand-moved counter, so no outcome depends on
timing."""

from __future__ import annotations

import re
import socket
import threading

import pytest
from kubernetes import client, config

from gym_operator.leadership import UNINSTALLING, Leadership, LeadershipLost, LeadershipSettings
from gym_operator.specs import SpecError

pytestmark = pytest.mark.k8s
#: the Kubernetes Lease of release ``gym``'s operators (each test has it in a namespace of its own)
NAME = "gym-gym-checkpoint-operator"


@pytest.fixture
def kemu(kemu_shared):
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def coordination(kemu) -> client.CoordinationV1Api:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kemu.kubeconfig), client_configuration=cfg)
    return client.CoordinationV1Api(client.ApiClient(cfg))


def candidate(kemu, namespace: str, identity: str, clock: Clock | None = None, **timings: float) -> Leadership:
    settings = LeadershipSettings(
        namespace=namespace,
        name=NAME,
        identity=identity,
        **({"duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2} | timings),
    )
    return Leadership(settings, coordination(kemu), clock=clock or Clock())


def leadership_record(kemu, namespace: str) -> client.V1Lease:
    return coordination(kemu).read_namespaced_lease(NAME, namespace)


def test_one_candidate_holds_the_leadership_another_takes_it_only_once_unrenewed_for_its_duration(
    kemu, namespace
) -> None:
    a_clock, b_clock = Clock(), Clock()
    a, b = candidate(kemu, namespace, "a", a_clock), candidate(kemu, namespace, "b", b_clock)
    assert a.try_acquire_or_renew(5) is True  # created
    held = leadership_record(kemu, namespace).spec
    assert (held.holder_identity, held.lease_duration_seconds, held.lease_transitions) == ("a", 15, 0)

    assert b.try_acquire_or_renew(5) is False and b.holder == "a"
    b_clock.now += 14.9
    assert b.try_acquire_or_renew(5) is False  # not yet a leadership duration since b first saw this record
    assert a.try_acquire_or_renew(5) is True  # a renews: a new record...
    b_clock.now += 1.0
    assert b.try_acquire_or_renew(5) is False  # ...which b sees as changed: its wait starts again
    b_clock.now += 15.1
    assert b.try_acquire_or_renew(5) is True  # unrenewed for 15 s as b saw it: b takes it
    taken = leadership_record(kemu, namespace).spec
    assert (taken.holder_identity, taken.lease_transitions) == ("b", 1)
    assert a.try_acquire_or_renew(5) is False and a.holder == "b"  # and a cannot renew any more


def test_every_write_is_conditional_so_two_candidates_never_both_win(kemu, namespace) -> None:
    a, b = candidate(kemu, namespace, "a"), candidate(kemu, namespace, "b")
    assert a.try_acquire_or_renew(5) is True
    api = coordination(kemu)
    stale = leadership_record(kemu, namespace)
    assert a.try_acquire_or_renew(5) is True  # a renews after the read above
    stale.spec.holder_identity = "b"
    with pytest.raises(client.ApiException) as conflict:
        api.replace_namespaced_lease(NAME, namespace, stale)
    assert conflict.value.status == 409  # the read's resourceVersion is old: no overwrite
    stale.metadata.resource_version = None
    with pytest.raises(client.ApiException) as unconditional:
        api.replace_namespaced_lease(NAME, namespace, stale)
    assert unconditional.value.status == 422 and "must be specified for an update" in unconditional.value.body
    assert leadership_record(kemu, namespace).spec.holder_identity == "a"
    # a second create of the same Lease fails (409 AlreadyExists): b's first attempt reads, and then waits
    assert b.try_acquire_or_renew(5) is False


def test_a_leader_whose_leadership_another_holds_gives_up_at_once(kemu, namespace) -> None:
    b_clock = Clock()
    a = candidate(kemu, namespace, "a", duration_s=3, renew_deadline_s=2, retry_period_s=0.05)
    b = candidate(kemu, namespace, "b", b_clock, duration_s=3, renew_deadline_s=2, retry_period_s=0.05)
    stop = threading.Event()
    assert a.acquire(stop) and a.leader
    assert b.try_acquire_or_renew(5) is False
    b_clock.now += 100  # as if a's renewals stopped reaching the API server for that long (b's view)
    lost: list[str] = []
    a_took = threading.Event()

    def on_lost(why: str) -> None:
        lost.append(why)
        a_took.set()

    # b's record is written before a's next renewal reads: a then finds another holder and loses at once
    assert b.try_acquire_or_renew(5) is True
    keeper = threading.Thread(target=a.keep, args=(stop, on_lost), daemon=True)
    keeper.start()
    assert a_took.wait(30), "the leader never noticed the Lease was taken"
    stop.set()
    keeper.join(10)
    assert lost == [f"lost Lease {namespace}/{NAME}: the Lease is held by b"]
    assert a.leader is False


def test_a_leader_that_cannot_reach_the_api_gives_up_after_the_renew_deadline(kemu, namespace) -> None:
    clock = Clock()
    a = candidate(kemu, namespace, "a", clock, duration_s=3, renew_deadline_s=2, retry_period_s=0.05)
    stop = threading.Event()
    assert a.acquire(stop)
    with socket.socket() as closed:  # a port nothing listens on: the API server is out of reach
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    cfg = client.Configuration()
    cfg.host, cfg.retries = f"http://127.0.0.1:{port}", 0
    a.api = client.CoordinationV1Api(client.ApiClient(cfg))
    lost: list[str] = []
    keeper = threading.Thread(target=a.keep, args=(stop, lost.append), daemon=True)
    keeper.start()
    for _ in range(200):  # renewals fail; the deadline passes on the candidate's own clock
        if lost:
            break
        clock.now += 0.1
        stop.wait(0.05)
    keeper.join(30)
    stop.set()
    assert not keeper.is_alive() and len(lost) == 1, lost
    assert lost[0].startswith(f"lost Lease {namespace}/{NAME}: renewing failed")


def test_a_released_leadership_is_taken_at_once(kemu, namespace) -> None:
    a, b = candidate(kemu, namespace, "a"), candidate(kemu, namespace, "b")
    stop = threading.Event()
    assert a.acquire(stop)
    assert b.try_acquire_or_renew(5) is False
    a.release()
    released = leadership_record(kemu, namespace).spec
    assert released.holder_identity is None and released.lease_duration_seconds == 1
    assert b.try_acquire_or_renew(5) is True  # no waiting: nobody holds it
    assert leadership_record(kemu, namespace).spec.holder_identity == "b"


def test_settings_refuse_a_renew_deadline_a_standby_could_overtake() -> None:
    env = {"GYMCKPT_RELEASE": "gym", "POD_NAME": "gym-operator-abc", "GYMCKPT_LEADER_RENEW_DEADLINE_SECONDS": "20"}
    with pytest.raises(SpecError, match=re.escape("need leadership duration > renew deadline > 1.2 x retry period")):
        LeadershipSettings.from_env("default", env)
    ok = LeadershipSettings.from_env("default", {k: v for k, v in env.items() if "RENEW" not in k})
    assert ok.name == "gym-gym-checkpoint-operator" and ok.identity.startswith("gym-operator-abc_")
    assert (ok.duration_s, ok.renew_deadline_s, ok.retry_period_s) == (15, 10, 2)


def test_the_fence_names_the_term_and_ends_a_leader_whose_renewal_is_too_old(kemu, namespace) -> None:
    """Fencing: while its last renewal is recent on its own clock the leader's fence names its term (the Lease's
    leaseTransitions, one more at every change of holder); past the renew deadline (a frozen process waking up) the
    fence calls on_lost before anything could be sent, without asking the API server. A new holder gets a newer
    term, and a Lease released and taken again is a new term too."""
    a_clock, b_clock = Clock(), Clock()
    a = candidate(kemu, namespace, "a", a_clock)
    b = candidate(kemu, namespace, "b", b_clock)
    stop = threading.Event()
    assert a.acquire(stop)
    assert a.fence() == f"{namespace}/{NAME}/0"
    lost: list[str] = []
    a.on_lost = lost.append
    a_clock.now += 9.9  # the renew deadline is 10 s
    assert a.fence() == f"{namespace}/{NAME}/0" and not lost
    a_clock.now += 0.2
    a.api = None  # type: ignore[assignment]  # the fence must not need the API server
    with pytest.raises(LeadershipLost):
        a.fence()
    assert len(lost) == 1 and "nothing more is sent in its name" in lost[0]
    a.api = coordination(kemu)
    assert b.try_acquire_or_renew(5) is False  # held by a, as b first sees it
    b_clock.now += 100
    assert b.try_acquire_or_renew(5) is True and b.leader is False  # (try_acquire_or_renew alone: not acquire())
    b.leader = True
    assert b.fence() == f"{namespace}/{NAME}/1"
    b.release()
    assert a.try_acquire_or_renew(5) is True and leadership_record(kemu, namespace).spec.lease_transitions == 2


def test_a_marked_lease_is_never_taken_and_a_stale_mark_is_ignored_and_removed(kemu, namespace) -> None:
    """The uninstall mark (the pre-delete hook's annotation, naming the operator Deployment's uid): no candidate
    takes a marked Lease; one of another Deployment (a later install under the same name) ignores it and its leader
    removes it."""
    api = coordination(kemu)
    old = candidate(kemu, namespace, "old")
    old.instance = "uid-1"
    assert old.acquire(threading.Event())
    old.release()
    api.patch_namespaced_lease(NAME, namespace, {"metadata": {"annotations": {UNINSTALLING: "uid-1"}}})
    same = candidate(kemu, namespace, "same")
    same.instance = "uid-1"
    assert same.try_acquire_or_renew(5) is False and same.uninstalling == "uid-1"
    later = candidate(kemu, namespace, "later")
    later.instance = "uid-2"
    assert later.try_acquire_or_renew(5) is True and later.uninstalling is None
    assert UNINSTALLING not in (leadership_record(kemu, namespace).metadata.annotations or {})
