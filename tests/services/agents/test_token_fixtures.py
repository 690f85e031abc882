"""Token records in the formats written before the token store (``tests/fixtures/token_records``, made by the code
of 2291dec) still restore: a checkpoint of a stack with a cut generation, a live rollout's and a finished rollout's
token ledgers (schema 2) and an episode (schema 1), and schema 1 ledger and prefix records."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.services.agents.real import simple_stack
from tests.services.agents.stack import stack

from gym_services.control.participant import RestoredRecord
from gym_services.models.inference_worker.policies.base import load_tasks

FIXTURE = Path(__file__).parents[2] / "fixtures" / "token_records"
ROW = load_tasks("indirect_prompt_injection")[0]


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def test_a_checkpoint_of_the_json_token_formats_restores_what_the_old_code_restored(worker, tmp_path) -> None:
    """The records of 2291dec (ledger schema 2, prefix schema 2, episode schema 1) restore into exactly the state that
    code restored them into (``expected.json``'s ``restored``, made by it), and the restored episode continues its cut
    generation to the end. (Its answer is not compared with the old run's: the built-in worker reports float32
    log-probs since, so the generation after the cut has other log-probs than the old worker's.)"""
    expected = json.loads((FIXTURE / "expected.json").read_text())
    shutil.copytree(FIXTURE / "store", tmp_path / "store")
    async with stack(simple_stack(worker.url, "indirect_prompt_injection", "ipi-follow", tokens=True)) as s:
        restore = await s.coordinator.restore("tok-ck", f"file://{tmp_path / 'store'}")
        assert restore.status == "completed", restore.error
        assert restore.episodes == {"ipi-done": 1, "ipi-live": 1}  # no controller: every ledger is in scope
        restored = expected["restored"]
        boundary = s.participant.episodes["ipi-live"].boundary.model_dump(mode="json")
        assert digest(boundary) == restored["boundary"]
        staged = {
            rollout_id: {
                "attempt": prefix.attempt,
                "text": prefix.text,
                "complete": prefix.complete,
                "finish_reason": prefix.finish_reason,
                "prompt_tokens": prefix.prompt_tokens,
                "completion_tokens": prefix.completion_tokens,
                **{k: list(v) for k, v in prefix.tokens.fields().items()},
            }
            for (rollout_id, _), prefix in s.wire.apps["model"].state.generations.staged.items()
            if prefix.tokens is not None
        }
        assert {rid: digest(p) for rid, p in staged.items()} == restored["prefixes"]
        for rollout_id, want in restored["ledgers"].items():
            frozen = await s.http.post("http://model/v1/ledger/freeze", json={"rollout_id": rollout_id})
            assert frozen.status_code == 200, frozen.text
            body = frozen.json()
            body.pop("snapshot_id")
            assert digest(body) == want, rollout_id
    async with stack(simple_stack(worker.url, "indirect_prompt_injection", "ipi-follow", tokens=True)) as s:
        restore = await s.coordinator.restore("tok-ck", f"file://{tmp_path / 'store'}")  # again: nothing frozen
        assert restore.status == "completed", restore.error
        reply = await s.run(ROW, "ipi-live", 1)
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["response"]["output"]) == expected["result_outputs"]
        assert s.wire.apps["model"].state.generations.totals["tokens_reused"] > 0  # the cut prefix was continued


async def test_schema_1_ledger_and_prefix_records_restore() -> None:
    from gym_services.models.policy_model.generations import GenerationManager
    from gym_services.models.policy_model.ledger.rollouts import TokenLedger
    from gym_services.models.policy_model.participant import ModelParticipant

    fixture = json.loads((FIXTURE / "records" / "schema1.json").read_text())
    records = [
        RestoredRecord(r["key"], r["data"].encode(), r["rollout_id"], r["attempt"])
        for r in (fixture["ledger_v1"], fixture["prefix_v1"])
    ]
    ledger = TokenLedger()
    manager = GenerationManager.__new__(GenerationManager)  # validate and install touch only its staged prefixes
    manager.staged, manager.live, manager._live_of = {}, {}, {}
    participant = ModelParticipant(manager, ledger)
    await participant.install(await participant.validate(records))

    want = fixture["expected"]["ledger"]
    restored = ledger.rollouts["r-old"].read("r-old").model_dump(mode="json")
    assert restored == {**want, "attempt": want["attempt"] + 1, "version": want["version"] + 1}
    ((key, staged),) = manager.staged.items()
    assert key[0] == "r-old" and staged.attempt == 3 and staged.tokens is None
    prefix = fixture["expected"]["prefix"]
    assert (staged.text, staged.complete, staged.finish_reason, staged.completion_tokens) == (
        prefix["text"],
        prefix["complete"],
        prefix["finish_reason"],
        prefix["completion_tokens"],
    )
