"""The participant phases move only along the declared table, and admission follows them."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry, Gauge

from gym_services.control.admission import Admission
from gym_services.control.phases import TRANSITIONS, IllegalTransition, PhaseMachine
from gym_services.control.protocol import OPEN_PHASES, Phase

#: the paths docs/protocol.md describes: a checkpoint (resumed, aborted, blocked, final: held, then aborted) and a
#: restore (resumed, undone, refused)
PATHS = [
    [Phase.OPEN, Phase.PREPARING, Phase.PREPARED, Phase.CAPTURED, Phase.FINAL, Phase.OPEN],
    [Phase.FRESH, Phase.PREPARING, Phase.PREPARED, Phase.CAPTURED, Phase.OPEN],
    [Phase.OPEN, Phase.PREPARING, Phase.PREPARED, Phase.CAPTURED, Phase.OPEN],
    [Phase.OPEN, Phase.PREPARING, Phase.PREPARED, Phase.OPEN],
    [Phase.OPEN, Phase.PREPARING, Phase.BLOCKED, Phase.OPEN],
    [Phase.OPEN, Phase.PREPARING, Phase.OPEN],
    [Phase.FRESH, Phase.RESTORING, Phase.RESTORED, Phase.OPEN],
    [Phase.FRESH, Phase.RESTORING, Phase.RESTORED, Phase.FRESH],
    [Phase.OPEN, Phase.RESTORING, Phase.OPEN],
]


def machine() -> tuple[PhaseMachine, Admission, Gauge]:
    admission = Admission("p")
    gauge = Gauge("gym_admission_open", "test", registry=CollectorRegistry())
    return PhaseMachine(admission, gauge), admission, gauge


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " -> ".join(path))
def test_documented_paths_are_allowed_and_admission_follows(path: list[Phase]) -> None:
    phases, admission, gauge = machine()
    phases.phase = path[0]
    for phase in path[1:]:
        phases.move(phase, f"to {phase}", "ck-1")
        assert admission.is_open is (phase in OPEN_PHASES)
        assert gauge._value.get() == (1 if phase in OPEN_PHASES else 0)
    assert phases.last_event == f"to {path[-1]}"


def test_no_other_move_is_allowed() -> None:
    allowed = {(a, b) for path in PATHS for a, b in itertools.pairwise(path)}
    allowed |= {
        (Phase.OPEN, Phase.PREPARING),
        (Phase.FRESH, Phase.PREPARING),
        (Phase.OPEN, Phase.RESTORING),
        (Phase.RESTORED, Phase.OPEN),
        (Phase.RESTORING, Phase.FRESH),
    }
    for start, targets in TRANSITIONS.items():
        for target in Phase:
            phases, _admission, _ = machine()
            phases.phase = start
            if (start, target) in allowed:
                assert target in targets
                continue
            assert target not in targets, (start, target)
            with pytest.raises(IllegalTransition):
                phases.move(target, "nope", "ck-1")
            assert phases.phase is start


def test_every_phase_has_a_way_back_to_open_admission() -> None:
    for start in Phase:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & OPEN_PHASES, start
