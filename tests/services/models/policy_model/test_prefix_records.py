"""A generation's checkpoint records: the prompt record (its prompt ids, unchanged while the call runs) and the
prefix record (header, generated ids, log-probs). A checkpoint of a call that is still running writes what it
generated since the previous one, not its prompt again (``docs/protocol.md``, "The prefix record")."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.support.records import model_pack_writer, publish_alone

from gym_services.base.tokens import Tokens
from gym_services.control.packs import PersistResult, ReuseIndex
from gym_services.control.participant import Capture, FrozenRecord, InvalidState, RestoredRecord, Scope
from gym_services.control.protocol import Role
from gym_services.control.storage import MemoryStorage
from gym_services.control.store import CheckpointStore
from gym_services.models.policy_model.generations import GenerationManager
from gym_services.models.policy_model.ledger.records import entry_sequence, is_ledger_record, parse_records
from gym_services.models.policy_model.ledger.rollouts import TokenLedger
from gym_services.models.policy_model.ledger.wire import LedgerEntry
from gym_services.models.policy_model.participant import MODEL_ENCODER, Frozen, ModelParticipant, captured
from gym_services.models.policy_model.prefixes import (
    PREFIX_SCHEMA_VERSION,
    PROMPT_SUFFIX,
    StagedPrefix,
    is_prompt_record,
    prefix_record_key,
    read_records,
)

FIXTURE = Path(__file__).parents[3] / "fixtures" / "prefix_records" / "schema3.json"
DIGEST = "d" * 64


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(150_000) for _ in range(n)]


def generated_bytes(generated: list[int]) -> int:
    """What a prefix record of a cut generation holds besides its prompt's length: the generated ids and log-probs (4
    bytes each), the text (a byte a token here) and the header."""
    return 4 * 2 * len(generated) + len(generated) + 300


def cut(prompt: list[int], generated: list[int]) -> StagedPrefix:
    """A generation of rollout ``r`` cut after ``generated``."""
    log_probs = [-(i % 17) / 8 for i in range(len(generated))]
    tokens = Tokens.of(prompt, generated, log_probs)
    return StagedPrefix(0, "x" * len(generated), False, None, len(prompt), len(generated), tokens)


def capture(ledger: TokenLedger, prefix: StagedPrefix) -> list[FrozenRecord[Frozen]]:
    return captured(ledger, [(("r", DIGEST), prefix)], Scope())


def encoded(records: list[FrozenRecord[Frozen]]) -> list[RestoredRecord]:
    return [RestoredRecord(r.key, MODEL_ENCODER.encode(r.state), r.rollout_id, r.attempt) for r in records]


def changed_bytes(before: list[RestoredRecord], after: list[RestoredRecord]) -> dict[str, int]:
    """The records of ``after`` whose bytes (by sha256) ``before`` does not hold, and their sizes: what the pack
    writer writes again."""
    held = {hashlib.sha256(r.data).digest() for r in before}
    return {r.key: len(r.data) for r in after if hashlib.sha256(r.data).digest() not in held}


def restored(records: list[RestoredRecord]) -> StagedPrefix:
    ledgers = parse_records([r for r in records if is_ledger_record(r.key)])
    staged = read_records(
        [r for r in records if not is_ledger_record(r.key)], lambda rid, i: entry_sequence(ledgers[rid], i)
    )
    return staged["r", DIGEST]


def write(store: CheckpointStore, pool, cid: str, records, reuse: list[ReuseIndex]) -> PersistResult:
    """One checkpoint of the model participant, written and published as the coordinator does."""
    store.claim(cid, f"tx-{cid}", "test", ["policy-model"])
    written = model_pack_writer(pool, MODEL_ENCODER).write(store, Capture(records), cid, reuse)
    publish_alone(store, cid, written, "policy-model", Role.MODEL)
    return written


def test_a_first_call_cut_at_two_checkpoints_writes_its_prompt_once() -> None:
    """A rollout's first call (system prompt, tool schemas, first message: 6,000 ids, no ledger entry to be written
    against) is cut by two checkpoints, 60 ids apart: the second rewrites only the prefix record (the header with
    the text, the 100 generated ids and log-probs: what the call generated, not its prompt) and references the
    prompt record the first wrote."""
    rng = random.Random(5)
    prompt, generated = ids(rng, 6000), ids(rng, 100)
    ledger = TokenLedger()
    first = encoded(capture(ledger, cut(prompt, generated[:40])))
    second = encoded(capture(ledger, cut(prompt, generated)))
    assert [r.key for r in second] == [prefix_record_key("r", DIGEST) + PROMPT_SUFFIX, prefix_record_key("r", DIGEST)]
    assert len(first[0].data) > 4 * len(prompt)  # the prompt, whole, once
    changed = changed_bytes(first, second)
    assert list(changed) == [prefix_record_key("r", DIGEST)]
    assert changed[prefix_record_key("r", DIGEST)] <= generated_bytes(generated)
    assert restored(second).tokens == cut(prompt, generated).tokens  # token for token
    with ThreadPoolExecutor(2) as pool:
        store = CheckpointStore(MemoryStorage("ckpt"))
        one = write(store, pool, "ck-1", capture(ledger, cut(prompt, generated[:40])), [])
        two = write(store, pool, "ck-2", capture(ledger, cut(prompt, generated)), [one.index])
    assert two.reused == 1 and two.written_bytes < 4 * len(prompt) / 4, two  # the prompt record referenced


def test_a_call_with_a_ledger_base_cut_at_two_checkpoints_writes_its_new_turn_once() -> None:
    """A later call (its prompt: the rollout's last recorded call, its answer and a 4,000-id tool output) cut by two
    checkpoints: the prompt record holds the new turn's ids (written against the ledger entry), once."""
    rng = random.Random(9)
    ledger = TokenLedger()
    earlier = Tokens.of(ids(rng, 3000), ids(rng, 50), [-0.5] * 50)
    ledger.begin_call("r", "c-0", 0)
    ledger.put(LedgerEntry.of_call("r", "c-0", earlier, model="m"), 0)
    prompt, generated = [*earlier.sequence(), *ids(rng, 4000)], ids(rng, 90)
    first = encoded(capture(ledger, cut(prompt, generated[:30])))
    second = encoded(capture(ledger, cut(prompt, generated)))
    prompt_record = next(r for r in first if is_prompt_record(r.key))
    assert 4 * 4000 < len(prompt_record.data) < 4 * 4000 + 300  # the new turn, not the context again
    changed = changed_bytes(first, second)
    assert set(changed) == {prefix_record_key("r", DIGEST)}  # the ledger's chunk, its head and the prompt: reused
    assert changed[prefix_record_key("r", DIGEST)] <= generated_bytes(generated)
    assert restored(second).tokens == cut(prompt, generated).tokens


def test_a_prefix_or_prompt_record_without_the_other_is_refused() -> None:
    rng = random.Random(2)
    records = encoded(capture(TokenLedger(), cut(ids(rng, 500), ids(rng, 20))))
    prompt, prefix = records
    with pytest.raises(InvalidState, match=r"its prompt record .*\.prompt is missing"):
        read_records([prefix], lambda rid, i: entry_sequence({}, i))
    with pytest.raises(InvalidState, match="holds a prompt that no prefix record uses"):
        read_records([prompt], lambda rid, i: entry_sequence({}, i))
    text_only = encoded(capture(TokenLedger(), StagedPrefix(0, "done", True, "stop", 9, 3, None)))
    assert [r.key for r in text_only] == [prefix_record_key("r", DIGEST)]  # no tokens: no prompt record
    with pytest.raises(InvalidState, match="holds a prompt that no prefix record uses"):
        read_records([prompt, *text_only], lambda rid, i: entry_sequence({}, i))
    other = encoded(captured(TokenLedger(), [(("r", "e" * 64), cut(ids(rng, 500), ids(rng, 20)))], Scope()))[0]
    swapped = RestoredRecord(prompt.key, other.data, "r", 0)  # another call's prompt under this call's key
    with pytest.raises(InvalidState, match="does not hold the prompt its key names"):
        read_records([swapped, prefix], lambda rid, i: entry_sequence({}, i))
    with pytest.raises(InvalidState, match="manifest identity"):
        read_records([RestoredRecord(prompt.key, prompt.data, "r", 1), prefix], lambda rid, i: entry_sequence({}, i))
    with pytest.raises(InvalidState, match="not a prompt record"):
        read_records(
            [RestoredRecord(prompt.key, prompt.data[:-3], "r", 0), prefix], lambda rid, i: entry_sequence({}, i)
        )
    assert read_records(records, lambda rid, i: entry_sequence({}, i))["r", DIGEST].attempt == 1


async def test_schema_3_prefix_records_still_restore() -> None:
    """Records the code before the prompt record wrote (``tests/fixtures/prefix_records``): a cut generation written
    against a ledger entry, a first call's whole prompt, a text-only response; restored through the participant."""
    fixture = json.loads(FIXTURE.read_text())
    records = [
        RestoredRecord(r["key"], base64.b64decode(r["data"]), r["rollout_id"], r["attempt"]) for r in fixture["records"]
    ]
    assert {r.data[0] for r in records if r.key.startswith("prefix-")} == {3}
    manager = GenerationManager.__new__(GenerationManager)  # validate and install touch only its staged prefixes
    manager.staged, manager.live, manager._live_of = {}, {}, {}
    participant = ModelParticipant(manager, TokenLedger())
    await participant.install(await participant.validate(records))
    assert len(manager.staged) == len(fixture["expected"]) == 3
    for (rollout_id, digest), staged in manager.staged.items():
        want = fixture["expected"][rollout_id]
        assert digest == want["digest"]
        got = {
            "attempt": staged.attempt,
            "text": staged.text,
            "complete": staged.complete,
            "finish_reason": staged.finish_reason,
            "prompt_tokens": staged.prompt_tokens,
            "completion_tokens": staged.completion_tokens,
            "tokens": None if staged.tokens is None else staged.tokens.fields(),
        }
        assert got == {k: v for k, v in want.items() if k != "digest"}, rollout_id
    assert PREFIX_SCHEMA_VERSION == 4  # what is written now; schema 3 only read


async def test_a_restore_whose_prompt_record_is_missing_installs_nothing() -> None:
    """The model participant's validate refuses the checkpoint before anything (ledger or prefix) is installed."""
    rng = random.Random(4)
    ledger = TokenLedger()
    earlier = Tokens.of(ids(rng, 200), ids(rng, 10), [-0.5] * 10)
    ledger.begin_call("r", "c-0", 0)
    ledger.put(LedgerEntry.of_call("r", "c-0", earlier, model="m"), 0)
    records = encoded(capture(ledger, cut([*earlier.sequence(), *ids(rng, 300)], ids(rng, 20))))
    manager = GenerationManager.__new__(GenerationManager)  # validate and install touch only its staged prefixes
    manager.staged, manager.live, manager._live_of = {}, {}, {}
    fresh = TokenLedger()
    participant = ModelParticipant(manager, fresh)
    with pytest.raises(InvalidState, match=r"prompt record .* is missing"):
        await participant.validate([r for r in records if not is_prompt_record(r.key)])
    assert manager.staged == {} and fresh.rollouts == {}
    await participant.install(await participant.validate(records))
    assert manager.staged["r", DIGEST].attempt == 1 and fresh.rollouts["r"].attempt == 1
