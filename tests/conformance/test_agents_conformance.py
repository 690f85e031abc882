"""Our agents build the same model inputs and answer the same /run results as NeMo Gym 0.7.0's agents.

Every scenario of ``agents_cases.py`` (scripted model outputs, scripted environment answers) runs
through NeMo Gym's released ``simple_agent``, ``proof_refinement_agent`` and ``gymnasium_agent``
(unmodified, in the oracle: ``oracle/glue_agents.py``) and through ours (real Starlette app, /run
route, checkpointing on). Compared: every model request (items, order, the exact text of every
function-call output, instructions, tools, parameters) and its cookies, every request to the
environment (path, body, cookies), the /run status and answer. Every difference must be one of
``ALLOWED`` (each explained in tests/conformance/README.md), and every allowed difference must
still occur (the list is exact).
"""

from __future__ import annotations

import pytest

from tests.conformance.agents_cases import all_cases, invalid_row_cases
from tests.conformance.agents_compare import Allowed, Diff, compare, reference, run_ours
from tests.conformance.http_cases import nested_422
from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.reference import reference_root

COOKIES = (
    "each downstream server gets only its own cookies: the episode keeps one cookie jar per server "
    "(part of its boundary, so it travels in a checkpoint); NeMo Gym's agents pass one jar along, so "
    "resources servers also get the model's cookies and the proof agent's model the resources' ones"
)
ALLOWED = [
    Allowed("env_request", r"cookies$", COOKIES),
    Allowed(
        "model_request",
        r"cookies$",
        COOKIES,
        case="proved on the first turn|two corrections then proved|corrections exhausted",
    ),
    Allowed(
        "run_answer",
        r"^\.response\.metadata\.ng_termination_message$",
        "our own wording of the termination message (the reason code is the same; NeMo Gym's text is not copied)",
        case="reasoning only|empty output",
    ),
    Allowed(
        "env_request",
        r"/verify body\.response\.metadata\.ng_termination_message$",
        "our own wording of the termination message (the reason code is the same; NeMo Gym's text is not copied)",
        case="reasoning only|empty output",
    ),
    Allowed(
        "env_request",
        r"/step body\._ng_step_request_id$",
        "the step request id is <rollout id>:<step> instead of a random uuid: a step repeated by a restored "
        "attempt carries the same id, so the environment recognises it",
        case="step idempotency",
    ),
]

CASES = all_cases(reference_root())
_seen: set[int] = set()


def unexplained(diffs: list[Diff]) -> list[Diff]:
    out = []
    for d in diffs:
        covering = [i for i, a in enumerate(ALLOWED) if a.covers(d)]
        _seen.update(covering)
        if not covering:
            out.append(d)
    return out


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["kind"] + ": " + c["name"] for c in CASES])
async def test_same_model_inputs_and_results(oracle: Oracle, index: int) -> None:
    case = CASES[index]
    ref = reference(oracle, case, index)
    assert ref["status"] == 200, ref["text"][:2000]  # every scenario is a normal episode for the reference
    ours = await run_ours(case, index)
    assert ours["model_requests"], "the scenario must reach the model"
    bad = unexplained(compare(case, ref, ours))
    assert not bad, "\n".join(map(str, bad))


def test_every_allowed_difference_still_occurs() -> None:
    if len(_seen) == 0:
        pytest.skip("runs after the scenarios")
    assert _seen == set(range(len(ALLOWED))), [str(ALLOWED[i].reason) for i in set(range(len(ALLOWED))) - _seen]


async def test_a_changed_tool_output_is_caught(oracle: Oracle) -> None:
    """The comparison sees one byte of a function-call output: a space added to a tool's answer differs."""
    index = next(i for i, c in enumerate(CASES) if c["name"] == "one tool call, list input, params")
    case = CASES[index]
    ref = reference(oracle, case, index)
    altered = {**case, "env": {**case["env"], "/lookup": [{"text": '{"output": "7"}'}]}}
    ours = await run_ours(altered, index)
    bad = unexplained(compare(case, ref, ours))
    assert any(d.area == "model_request" and d.where.endswith(".output") for d in bad), bad


INVALID = invalid_row_cases()
#: rows whose 422 is the named known gap of tests/conformance/http_cases.py (a value inside one of the SDK's unions)
NESTED_ROWS = {"input item of unknown type", "tool without name"}


@pytest.mark.parametrize("index", range(len(INVALID)), ids=[c["kind"] + ": " + c["name"] for c in INVALID])
async def test_malformed_rows_are_refused_alike(oracle: Oracle, index: int) -> None:
    """A row NeMo Gym's agent refuses gets the same 422 body from ours, and nothing is called."""
    case = INVALID[index]
    ref = reference(oracle, case, index)
    ours = await run_ours(case, index)
    assert ref["status"] == 422 and not ref["model_requests"] and not ref["env_requests"], ref
    if case["name"] in NESTED_ROWS:  # the known gap NESTED_422: same status, same fields blamed
        assert nested_422({"status": ours["status"], "body": ours["text"]}, {"status": 422, "body": ref["text"]})
        assert ours["text"] != ref["text"]  # still a gap: when it closes, move the case out of NESTED_ROWS
    else:
        assert (ours["status"], ours["text"]) == (ref["status"], ref["text"])
    assert not ours["model_requests"] and not ours["env_requests"]
