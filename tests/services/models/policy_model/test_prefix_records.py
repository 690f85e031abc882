"""A generation's checkpoint records: the prompt record (its prompt ids, unchanged while the call runs), its chunks
(what it wrote between two captures) and its head. A checkpoint of a call that is still running writes what it
generated since the previous one, not its prompt or what it generated before again (``docs/protocol.md``, "The
prefix record")."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.support.records import model_pack_writer, publish_alone

from gym_services.base import token_codec
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
    SEALED_CHUNK_BYTES,
    ChunkCuts,
    StagedPrefix,
    chunk_record_key,
    is_chunk_record,
    is_prompt_record,
    prefix_record_key,
    read_records,
)

FIXTURES = Path(__file__).parents[3] / "fixtures" / "prefix_records"
DIGEST = "d" * 64


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(150_000) for _ in range(n)]


def generated_bytes(generated: list[int]) -> int:
    """What a chunk of a cut generation holds: the generated ids and log-probs (4 bytes each), the text (a byte a
    token here) and a few varints."""
    return 4 * 2 * len(generated) + len(generated) + 16


HEAD_BYTES = 400  # a head: the identity, the counts and where its first chunks start, as JSON


def cut(prompt: list[int], generated: list[int], cuts: ChunkCuts | None = None) -> StagedPrefix:
    """A generation of rollout ``r`` cut after ``generated``; ``cuts``: its chunks so far (a capture adds one)."""
    log_probs = [-(i % 17) / 8 for i in range(len(generated))]
    tokens = Tokens.of(prompt, generated, log_probs)
    text = "x" * len(generated)
    chunks = cuts.cut((len(generated), len(text)), True) if cuts is not None else ()
    return StagedPrefix(0, text, False, None, len(prompt), len(generated), tokens, chunks)


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
    against) is cut by two checkpoints, 40 ids apart: the second writes the chunk of those 40 ids and the head, and
    references the prompt record and the first chunk the first wrote."""
    rng = random.Random(5)
    prompt, generated = ids(rng, 6000), ids(rng, 100)
    ledger, cuts = TokenLedger(), ChunkCuts()
    first = encoded(capture(ledger, cut(prompt, generated[:60], cuts)))
    second = encoded(capture(ledger, cut(prompt, generated, cuts)))
    head = prefix_record_key("r", DIGEST)
    assert [r.key for r in second] == [
        head + PROMPT_SUFFIX,
        chunk_record_key("r", DIGEST, (0, 0)),
        chunk_record_key("r", DIGEST, (60, 60)),
        head,
    ]
    assert len(first[0].data) > 4 * len(prompt)  # the prompt, whole, once
    changed = changed_bytes(first, second)
    assert set(changed) == {chunk_record_key("r", DIGEST, (60, 60)), head}
    assert changed[chunk_record_key("r", DIGEST, (60, 60))] <= generated_bytes(generated[60:])
    assert changed[head] <= HEAD_BYTES
    assert restored(second).tokens == cut(prompt, generated).tokens  # token for token
    with ThreadPoolExecutor(2) as pool:
        store = CheckpointStore(MemoryStorage("ckpt"))
        cuts = ChunkCuts()
        one = write(store, pool, "ck-1", capture(ledger, cut(prompt, generated[:60], cuts)), [])
        two = write(store, pool, "ck-2", capture(ledger, cut(prompt, generated, cuts)), [one.index])
    assert two.reused == 2 and two.written_bytes < 4 * len(prompt) / 4, two  # the prompt and first chunk referenced


def test_a_call_with_a_ledger_base_cut_at_two_checkpoints_writes_its_new_turn_once() -> None:
    """A later call (its prompt: the rollout's last recorded call, its answer and a 4,000-id tool output) cut by two
    checkpoints: the prompt record holds the new turn's ids (written against the ledger entry), once."""
    rng = random.Random(9)
    ledger = TokenLedger()
    earlier = Tokens.of(ids(rng, 3000), ids(rng, 50), [-0.5] * 50)
    ledger.begin_call("r", "c-0", 0)
    ledger.put(LedgerEntry.of_call("r", "c-0", earlier, model="m"), 0)
    prompt, generated = [*earlier.sequence(), *ids(rng, 4000)], ids(rng, 90)
    cuts = ChunkCuts()
    first = encoded(capture(ledger, cut(prompt, generated[:50], cuts)))
    second = encoded(capture(ledger, cut(prompt, generated, cuts)))
    prompt_record = next(r for r in first if is_prompt_record(r.key))
    assert 4 * 4000 < len(prompt_record.data) < 4 * 4000 + 300  # the new turn, not the context again
    changed = changed_bytes(first, second)
    # the ledger's chunk, its head, the prompt and the first chunk: reused
    assert set(changed) == {chunk_record_key("r", DIGEST, (50, 50)), prefix_record_key("r", DIGEST)}
    assert changed[chunk_record_key("r", DIGEST, (50, 50))] <= generated_bytes(generated[50:])
    assert restored(second).tokens == cut(prompt, generated).tokens


def test_a_generation_growing_over_many_captures_writes_what_is_new() -> None:
    """A generation of 3,000 tokens captured 30 times (100 tokens apart, about 900 bytes each): a capture writes the
    chunk of what it generated since the one before, merged with the small chunks before it (each merge at least
    doubles a chunk, none past ``SEALED_CHUNK_BYTES``), so each token is written at most 1 + log2(the bound / 900 B)
    times and a capture at most twice the bound more than what it adds; a sealed chunk is never written again; a head
    is a few hundred bytes; the 30th capture restores token for token and character for character."""
    rng = random.Random(3)
    prompt, generated = ids(rng, 2000), ids(rng, 3000)
    cuts = ChunkCuts()
    before: list[RestoredRecord] = []
    written = 0
    sealed: set[str] = set()
    for end in range(100, 3001, 100):
        records = encoded(capture(TokenLedger(), cut(prompt, generated[:end], cuts)))
        changed = changed_bytes(before, records)
        chunk_count = sum(1 for r in records if is_chunk_record(r.key))
        assert changed.pop(prefix_record_key("r", DIGEST)) <= HEAD_BYTES + 16 * chunk_count  # it lists their starts
        assert not sealed & set(changed), end
        chunk_bytes = sum(n for key, n in changed.items() if is_chunk_record(key))
        assert chunk_bytes <= generated_bytes(generated[end - 100 : end]) + 2 * SEALED_CHUNK_BYTES, (end, changed)
        written += chunk_bytes
        sealed |= {r.key for r in records if is_chunk_record(r.key) and len(r.data) >= SEALED_CHUNK_BYTES}
        before = records
    whole = sum(len(r.data) for r in before if is_chunk_record(r.key))
    assert written <= (1 + math.ceil(math.log2(max(2, SEALED_CHUNK_BYTES / 900)))) * whole, written / whole
    chunks = [r for r in before if is_chunk_record(r.key)]
    assert 3 <= len(chunks) <= 27_000 // SEALED_CHUNK_BYTES + 4, len(chunks)
    assert restored(before).tokens == cut(prompt, generated).tokens
    assert restored(before).text == "x" * 3000


def test_a_restored_prefix_keeps_its_chunks_and_the_next_checkpoint_references_them() -> None:
    """A restore stages the prefix for attempt + 1 with its chunks; the generation continuing it (``ChunkCuts.of``)
    adds a chunk for what it generates next, so the first checkpoint after the restore writes that chunk and the head,
    and references the prompt and the chunks the checkpoint before wrote (a chunk names no attempt)."""
    rng = random.Random(6)
    prompt, generated = ids(rng, 500), ids(rng, 200)
    cuts = ChunkCuts()
    cut(prompt, generated[:120], cuts)
    first = encoded(capture(TokenLedger(), cut(prompt, generated[:160], cuts)))
    staged = restored(first)
    assert staged.attempt == 1 and staged.chunks == ((0, 0), (120, 120))
    again = ChunkCuts.of(staged)
    grown = cut(prompt, generated[:180], again)  # 20 more: smaller than the chunk before, not merged with it
    continued = StagedPrefix(1, grown.text, False, None, len(prompt), 180, grown.tokens, grown.chunks)
    second = encoded(captured(TokenLedger(), [(("r", DIGEST), continued)], Scope()))
    assert {r.attempt for r in second} == {1}
    assert set(changed_bytes(first, second)) == {
        chunk_record_key("r", DIGEST, (160, 160)),
        prefix_record_key("r", DIGEST),
    }
    assert restored(second).tokens == cut(prompt, generated[:180]).tokens and restored(second).attempt == 2


def test_a_prefix_or_prompt_record_without_the_other_is_refused() -> None:
    rng = random.Random(2)
    records = encoded(capture(TokenLedger(), cut(ids(rng, 500), ids(rng, 20))))
    prompt, chunk, prefix = records
    with pytest.raises(InvalidState, match=r"its prompt record .*\.prompt is missing"):
        read_records([chunk, prefix], lambda rid, i: entry_sequence({}, i))
    with pytest.raises(InvalidState, match="holds a prompt that no prefix record uses"):
        read_records([prompt], lambda rid, i: entry_sequence({}, i))
    text_only = encoded(capture(TokenLedger(), StagedPrefix(0, "done", True, "stop", 9, 3, None)))
    assert [r.key for r in text_only] == [chunk_record_key("r", DIGEST, (0, 0)), prefix_record_key("r", DIGEST)]
    assert restored(text_only).text == "done" and restored(text_only).tokens is None  # no tokens: no prompt record
    with pytest.raises(InvalidState, match="holds a prompt that no prefix record uses"):
        read_records([prompt, *text_only], lambda rid, i: entry_sequence({}, i))
    other = encoded(captured(TokenLedger(), [(("r", "e" * 64), cut(ids(rng, 500), ids(rng, 20)))], Scope()))[0]
    swapped = RestoredRecord(prompt.key, other.data, "r", 0)  # another call's prompt under this call's key
    with pytest.raises(InvalidState, match="does not hold the prompt its key names"):
        read_records([swapped, chunk, prefix], lambda rid, i: entry_sequence({}, i))
    with pytest.raises(InvalidState, match="manifest identity"):
        read_records(
            [RestoredRecord(prompt.key, prompt.data, "r", 1), chunk, prefix], lambda rid, i: entry_sequence({}, i)
        )
    with pytest.raises(InvalidState, match="not a prompt record"):
        read_records(
            [RestoredRecord(prompt.key, prompt.data[:-3], "r", 0), chunk, prefix], lambda rid, i: entry_sequence({}, i)
        )
    assert read_records(records, lambda rid, i: entry_sequence({}, i))["r", DIGEST].attempt == 1


def edited(head: RestoredRecord, **fields: object) -> RestoredRecord:
    """A schema 5 head with some header fields changed."""
    size, offset = token_codec.read_varint(head.data, 1)
    header = {**json.loads(head.data[offset : offset + size]), **fields}
    data = json.dumps(header).encode()
    out = bytearray(head.data[:1])
    token_codec.write_varint(len(data), out)
    return RestoredRecord(head.key, bytes(out + data), head.rollout_id, head.attempt)


def test_a_chunk_missing_truncated_out_of_place_or_left_over_is_refused() -> None:
    rng = random.Random(8)
    prompt_ids, generated = ids(rng, 300), ids(rng, 90)
    cuts = ChunkCuts()
    cut(prompt_ids, generated[:60], cuts)
    records = encoded(capture(TokenLedger(), cut(prompt_ids, generated, cuts)))
    prompt, first, second, head = records
    assert (first.key, second.key) == (chunk_record_key("r", DIGEST, (0, 0)), chunk_record_key("r", DIGEST, (60, 60)))

    def read(*chosen: RestoredRecord) -> None:
        read_records(list(chosen), lambda rid, i: entry_sequence({}, i))

    with pytest.raises(InvalidState, match=r"its chunk .*\.g60\.60 is missing"):
        read(prompt, first, head)
    with pytest.raises(InvalidState, match="is not a chunk"):
        read(prompt, first, RestoredRecord(second.key, second.data[:-1], "r", 0), head)
    with pytest.raises(InvalidState, match="its key says"):  # a chunk's bytes under another chunk's key
        read(
            prompt, RestoredRecord(first.key, second.data, "r", 0), RestoredRecord(second.key, first.data, "r", 0), head
        )
    with pytest.raises(InvalidState, match="manifest identity does not match its head's"):
        read(prompt, first, RestoredRecord(second.key, second.data, "r", 7), head)
    stray = RestoredRecord(chunk_record_key("r", DIGEST, (90, 90)), second.data, "r", 0)
    with pytest.raises(InvalidState, match="a chunk that no prefix record lists"):
        read(prompt, first, second, head, stray)
    with pytest.raises(InvalidState, match="its chunks hold 60 token ids and 60 characters, not 90 and 90"):
        read(prompt, first, edited(head, chunks=[[0, 0]]))  # a head whose chunks end short of its counts
    overlapping = RestoredRecord(chunk_record_key("r", DIGEST, (50, 50)), second.data, "r", 0)
    with pytest.raises(InvalidState, match="does not start where the chunk before it ended"):
        read(prompt, first, overlapping, edited(head, chunks=[[0, 0], [50, 50]]))
    read(prompt, first, second, head)


@pytest.mark.parametrize("schema", [3, 4])
async def test_earlier_prefix_records_still_restore(schema: int) -> None:
    """Records the code before wrote (``tests/fixtures/prefix_records``): schema 3 (before the prompt record) and
    schema 4 (one prefix record beside its prompt record, before the chunks): a cut generation written against a
    ledger entry, a first call's whole prompt, a text-only response; restored through the participant."""
    fixture = json.loads((FIXTURES / f"schema{schema}.json").read_text())
    records = [
        RestoredRecord(r["key"], base64.b64decode(r["data"]), r["rollout_id"], r["attempt"]) for r in fixture["records"]
    ]
    assert {r.data[0] for r in records if r.key.startswith("prefix-") and not is_prompt_record(r.key)} == {schema}
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
        # the next checkpoint writes them in today's layout, and they restore the same again
        again = encoded(captured(TokenLedger(), [((rollout_id, digest), staged)], Scope()))
        assert {r.data[0] for r in again if not is_prompt_record(r.key) and not is_chunk_record(r.key)} == {5}
    assert PREFIX_SCHEMA_VERSION == 5  # what is written now; schemas 3 and 4 only read


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
