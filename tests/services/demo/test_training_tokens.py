"""The demo's training-token verdict reads what a trainer reads: each rollout's frozen token ledger.

A rollout is masked when its ledger is frozen ``incomplete`` (a model call was lost), whatever its result
row carries; and its tokens count as identical only when the ledger holds exactly the row's tokens.
"""

from __future__ import annotations

from gym_services.demo.report import compare, token_difference, training_tokens_verdict
from gym_services.demo.story import Run
from gym_services.models.policy_model.ledger.wire import FrozenRollout, LedgerEntry

PROMPT, IDS, LOGPROBS = [1, 2, 3], [7, 8], [-0.25, -1.5]


def _row(rid: str, ids: list[int] = IDS, logprobs: list[float] = LOGPROBS) -> dict:
    item = {
        "type": "message",
        "prompt_token_ids": PROMPT,
        "generation_token_ids": ids,
        "generation_log_probs": logprobs,
    }
    return {"_ng_rollout_id": rid, "agent": "agent-x", "reward": 1.0, "result": {"response": {"output": [item]}}}


def _frozen(
    rid: str, *, incomplete: bool = False, ids: list[int] = IDS, logprobs: list[float] = LOGPROBS
) -> FrozenRollout:
    entry = LedgerEntry(
        rollout_id=rid,
        model_call_id="call-1",
        prompt_token_ids=PROMPT,
        generation_token_ids=ids,
        generation_log_probs=logprobs,
    )
    return FrozenRollout(
        rollout_id=rid,
        attempt=1,
        entries=[entry],
        incomplete=incomplete,
        snapshot_id="s",
        version=3,
        lost_calls={"call-2": "never stored"} if incomplete else {},
    )


def _run(rids: list[str], **frozen: FrozenRollout) -> Run:
    run = Run(results={rid: _row(rid) for rid in rids})
    run.ledgers = {rid: frozen.get(rid.replace("-", "_")) or _frozen(rid) for rid in rids}
    return run


RIDS = ["0-0", "1-0", "2-0"]


def test_identical_rows_and_complete_ledgers_are_identical_and_unmasked() -> None:
    assert training_tokens_verdict(_run(RIDS), _run(RIDS), RIDS) == ("yes", [], 0)
    verdict = compare(_run(RIDS), _run(RIDS), {"agent-x": "env"})
    assert verdict.ok, verdict.problems


def test_an_incomplete_ledger_masks_its_rollout_although_its_row_carries_tokens() -> None:
    ckpt = _run(RIDS, **{"1_0": _frozen("1-0", incomplete=True)})
    assert ckpt.results["1-0"] == _run(RIDS).results["1-0"]  # the row alone cannot tell
    identical, differing, masked = training_tokens_verdict(_run(RIDS), ckpt, RIDS)
    assert (identical, differing, masked) == ("NO (1)", ["1-0"], 1)
    verdict = compare(_run(RIDS), ckpt, {"agent-x": "env"})
    assert not verdict.ok
    assert any("1 rollouts masked" in p for p in verdict.problems)


def test_a_ledger_that_differs_from_its_row_is_not_identical() -> None:
    other_logprob = _run(RIDS, **{"2_0": _frozen("2-0", logprobs=[-0.25, -1.5000001])})
    other_ids = _run(RIDS, **{"0_0": _frozen("0-0", ids=[7, 9])})
    assert training_tokens_verdict(_run(RIDS), other_logprob, RIDS) == ("NO (1)", ["2-0"], 0)
    assert training_tokens_verdict(other_ids, _run(RIDS), RIDS) == ("NO (1)", ["0-0"], 0)  # the uninterrupted run's too


def test_a_rollout_without_a_ledger_is_not_identical() -> None:
    ckpt = _run(RIDS)
    del ckpt.ledgers["1-0"]
    assert training_tokens_verdict(_run(RIDS), ckpt, RIDS) == ("NO (1)", ["1-0"], 0)


def test_a_multi_turn_row_carries_every_turn_in_all_attempts() -> None:
    """The proof refinement agent's row: ``response`` is the last turn, ``all_attempts`` holds every turn; a
    ledger with both calls equals it, one with the last call only does not."""
    first, last = _row("0-0", ids=[5], logprobs=[-0.5]), _row("0-0")
    row = {
        **last,
        "result": {
            **last["result"],
            "all_attempts": [{"response": first["result"]["response"]}, {"response": last["result"]["response"]}],
        },
    }
    both = _frozen("0-0")
    both.entries.insert(
        0, _frozen("0-0", ids=[5], logprobs=[-0.5]).entries[0].model_copy(update={"model_call_id": "c0"})
    )
    run = Run(results={"0-0": row}, ledgers={"0-0": both})
    assert training_tokens_verdict(run, run, ["0-0"]) == ("yes", [], 0)
    last_only = Run(results={"0-0": row}, ledgers={"0-0": _frozen("0-0")})
    assert training_tokens_verdict(run, last_only, ["0-0"]) == ("NO (1)", ["0-0"], 0)


def test_the_report_says_where_the_tokens_first_differ() -> None:
    """A sampled token that differs after the cut is named with its call, position, ids and log-probs."""
    ckpt = _run(RIDS, **{"1_0": _frozen("1-0", ids=[7, 9], logprobs=[-0.25, -2.0])})
    ckpt.results["1-0"] = _row("1-0", ids=[7, 9], logprobs=[-0.25, -2.0])
    said = "call 0 token 1: id 9 log-prob -2 (checkpointed) vs id 8 log-prob -1.5 (uninterrupted)"
    assert token_difference(_run(RIDS), ckpt, "1-0") == said
    verdict = compare(_run(RIDS), ckpt, {"agent-x": "env"})
    assert any(f"['1-0'] (1-0: {said})" in p for p in verdict.problems), verdict.problems
    near = _run(RIDS, **{"2_0": _frozen("2-0", logprobs=[-0.25, -1.5000001])})
    near.results["2-0"] = _row("2-0", logprobs=[-0.25, -1.5000001])
    assert token_difference(_run(RIDS), _run(RIDS), "2-0") == "the same ids and log-probs"
    assert token_difference(_run(RIDS), near, "2-0").startswith("call 0 token 1: id 8 log-prob -1.5")  # exactly
    missing = _run(RIDS)
    del missing.ledgers["0-0"]
    assert token_difference(_run(RIDS), missing, "0-0") == "the checkpointed run's token ledger is missing"
