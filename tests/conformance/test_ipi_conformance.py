"""indirect_prompt_injection answers exactly like NeMo Gym 0.7.0's server, in all nine domains.

The same HTTP steps go to the oracle (NeMo Gym's unmodified ``app.py``, tool and verifier modules
behind our FastAPI glue, ``oracle/glue_indirect_prompt_injection.py``) and to our server through its
real Starlette routes. Per step: status, body bytes, content type, and the session's environment
afterwards; per verify: the rewards. Differences must be zero, apart from the deliberate ones listed
in ``ipi_allowed.py`` (each of which the runs below must actually exhibit).

``benchmarks/conformance_ipi.py`` runs the same groups longer and prints a table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from gym_services.resources.indirect_prompt_injection import verifier
from gym_services.resources.indirect_prompt_injection.tools import DOMAINS
from tests.conformance import ipi_cases as cases
from tests.conformance.ipi_allowed import ALLOWED, allowed
from tests.conformance.ipi_ours import GLUE, Tally, compare, run_ours
from tests.conformance.ipi_run import invalid_verify_sequences, verify_sequences
from tests.conformance.oracle.client import Oracle

#: CI sizes; the benchmark runs more
RANDOM_SEQUENCES = 200
VERIFY_REQUESTS = 120
SEED = 11

SEEN_ALLOWED: Counter = Counter()


async def _check(oracle: Oracle, sequences: list[list[dict]]) -> Tally:
    refs = oracle.call(GLUE, "run_many", sequences)
    total = Tally()
    for steps, ref in zip(sequences, refs, strict=True):
        total.add(compare(steps, await run_ours(steps), ref, allowed=allowed, keep=5))
    SEEN_ALLOWED.update({k.removeprefix("allowed: "): n for k, n in total.kinds.items() if k.startswith("allowed: ")})
    assert total.differences == 0, "\n\n".join(
        [f"{total.differences} differences: {dict(total.kinds)}", *total.examples]
    )
    return total


def test_same_tools_and_verification_types(oracle: Oracle) -> None:
    reference = oracle.call(GLUE, "tool_names")
    assert {d: sorted(t) for d, t in reference.items()} == {d: sorted(t) for d, t in DOMAINS.items()}
    strict = oracle.call(GLUE, "verification_types")
    assert strict == {k: list(v) for k, v in verifier.STRICT_MATCH_KEYS.items()}


async def test_every_tool_with_valid_arguments(oracle: Oracle) -> None:
    tally = await _check(oracle, cases.valid_call_sequences(SEED, variants=1))
    assert len(tally.tools) == 97


async def test_invalid_arguments_bodies_paths_and_sessions(oracle: Oracle) -> None:
    await _check(oracle, cases.invalid_sequences())


async def test_framework_routes_unknown_paths_and_methods(oracle: Oracle) -> None:
    """/close_session, /reverify_mode, NeMo Gym's liveness routes, FastAPI's 404/405 bodies, before and after a
    seed; and the one known gap, /aggregate_metrics (NeMo Gym computes statistics, ours answers 404)."""
    tally = await _check(oracle, cases.route_sequences(SEED))
    assert tally.calls == 40
    [[ref]] = oracle.call(GLUE, "run_many", [[cases.AGGREGATE_METRICS]])
    [ours] = await run_ours([cases.AGGREGATE_METRICS])
    assert ref["status"] == 200 and (ours["status"], ours["body"]) == (404, '{"detail":"Not Found"}')


@pytest.mark.parametrize("part", range(4))
async def test_random_sequences(oracle: Oracle, part: int) -> None:
    """Seeded random sessions over all domains: valid and invalid calls, odd environments, reseeds."""
    sequences = cases.random_sequences(SEED, RANDOM_SEQUENCES)[part::4]
    tally = await _check(oracle, sequences)
    assert tally.calls > 4 * len(sequences)


async def test_verify_on_example_tasks_and_perturbed_predictions(oracle: Oracle) -> None:
    tally = await _check(oracle, verify_sequences(SEED, VERIFY_REQUESTS))
    assert tally.reward_checks >= VERIFY_REQUESTS * 0.8  # the rest fail as in NeMo Gym (500)


async def test_invalid_verify_requests(oracle: Oracle) -> None:
    await _check(oracle, invalid_verify_sequences())


def test_every_allowed_difference_was_exercised() -> None:
    """Each deliberate difference is real: the runs above met it (so none hides a mistake unused)."""
    if len(SEEN_ALLOWED) == 0:
        pytest.skip("runs alone; needs the conformance tests above in the same session")
    assert set(SEEN_ALLOWED) == set(ALLOWED), SEEN_ALLOWED


@pytest.fixture(autouse=True, scope="module")
def _order_guard() -> Iterator[None]:
    SEEN_ALLOWED.clear()
    yield
