"""The policy model on a real engine: llama.cpp's llama-server serving the tiny generated model (a real
byte-level BPE tokenizer, so tokens split multi-byte characters and text does not round-trip to the same
tokens). Every generation continued after a cut, a checkpoint or a killed server must equal the
uninterrupted one token for token and log-prob for log-prob, bit for bit (``llama_server_command`` runs one
sequence at a time in 1-token micro-batches, so nothing else the server computes changes a generation's sums;
benchmarks/llama_cpp_logprobs.py), greedy and with seeded sampling."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import random
from typing import Any

import httpx
import pytest
from tests.services.models.policy_model.model_support import generation_of, ident, tokens_received, wait_until
from tests.support.asgi import Control, base_config, serve
from tokenizers import Tokenizer

from gym_services.base.config import load_config
from gym_services.base.tokens import Tokens
from gym_services.models.llama_cpp.tiny_model import MULTILINGUAL, training_text
from gym_services.models.policy_model.app import Config, create_app
from gym_services.models.policy_model.engines import Halt
from gym_services.models.policy_model.upstream import Upstream, UpstreamConfig

pytestmark = pytest.mark.e2e

MAX_TOKENS = 80
PROMPTS = [
    "Größe und Maß: schreibe über 日本語, Привет and 🙂 🚀 — mit Umlauten.",
    "Cards ♠♥♦♣ and arrows → ← ≤ ≥; café naïve façade.",
    "中文的句子和标点。한국어 문장입니다.",
]
#: greedy, and sampling at temperature 1 seeded per position by the adapter
MODES = {"greedy": ({"temperature": 0.0}, {}), "seeded": ({"temperature": 1.0}, {"seed": 1234})}
RETRY = {"deadline_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.3}


def responses_body(prompt: str, mode: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "model": "tiny",
        "input": [{"role": "user", "content": prompt}],
        "max_output_tokens": max_tokens,
        **MODES[mode][0],
    }


def policy_app(urls: list[str], mode: str, **extra: Any):
    upstream = {
        "base_url": [f"{u}/v1" for u in urls],
        "engine": "llama.cpp",
        "extra_body": MODES[mode][1],
        "health_interval_s": 0.2,
    }
    return create_app(
        load_config(
            Config, overrides=base_config("policy_model", upstream=upstream, return_token_id_information=True, **extra)
        )
    )


def token_info(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    last = response["output"][-1]
    return last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item.get("type") == "message"
        for part in item.get("content", [])
    )


def assert_same_generation(got: dict[str, Any], expected: dict[str, Any]) -> None:
    got_prompt, got_ids, got_lps = token_info(got)
    prompt, ids, lps = token_info(expected)
    assert got_prompt == prompt
    differ = next(
        (i for i, (a, b) in enumerate(zip(got_ids, ids, strict=False)) if a != b), min(len(got_ids), len(ids))
    )
    assert got_ids == ids, f"token ids differ from position {differ}"
    assert got_lps == lps
    assert output_text(got) == output_text(expected)


def piece_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Every id's bytes, from the tokenizer file (GPT-2's byte-to-character map undone); special tokens b""."""
    chars = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {c: c for c in chars}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    back = {chr(v): k for k, v in mapping.items()}
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    pieces = []
    for i in range(tokenizer.get_vocab_size()):
        token = tokenizer.id_to_token(i)
        pieces.append(b"" if token in special else bytes(back[c] for c in token))
    return pieces


def ends_incomplete(data: bytes) -> bool:
    """llama-server's test: a lead byte among the last three bytes without all its continuation bytes."""
    for i in range(1, min(3, len(data)) + 1):
        c = data[-i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or ((c & 0xF8) == 0xF0 and i < 4):
            return True
    return False


def incomplete_positions(ids: list[int], pieces: list[bytes]) -> list[int]:
    """Positions whose token leaves the text inside a multi-byte character (llama-server withholds their ids)."""
    text, found = b"", []
    for i, token in enumerate(ids):
        text += pieces[token]
        if ends_incomplete(text):
            found.append(i)
    return found


@pytest.fixture(scope="module")
def pieces(tiny) -> list[bytes]:
    return piece_bytes(Tokenizer.from_file(str(tiny.tokenizer)))


_references: dict[tuple[str, str], dict[str, Any]] = {}


async def uninterrupted(url: str, prompt: str, mode: str) -> dict[str, Any]:
    """The uninterrupted response (one per prompt and mode, from the same build of llama-server)."""
    key = (prompt, mode)
    if key not in _references:
        async with serve(policy_app([url], mode)) as client:
            response = await client.post("/v1/responses", json=responses_body(prompt, mode))
            assert response.status_code == 200, response.text
            _references[key] = response.json()
    return _references[key]


async def test_the_generated_tokenizer_file_and_llama_server_tokenize_alike(llama_server, tiny) -> None:
    """The GGUF carries the tokenizer faithfully (vocabulary, merges, pre-tokenizer): a client can tokenize locally."""
    tokenizer = Tokenizer.from_file(str(tiny.tokenizer))
    text = training_text()
    chunks = [text[i : i + 300] for i in range(0, len(text), len(text) // 80)] + [MULTILINGUAL]
    chunks = [c for c in chunks if "<|" not in c]
    async with httpx.AsyncClient(timeout=60) as client:
        for chunk in chunks:
            answer = (
                await client.post(
                    f"{llama_server.url}/tokenize",
                    json={"content": chunk, "add_special": False, "parse_special": False},
                )
            ).json()
            assert answer["tokens"] == tokenizer.encode(chunk, add_special_tokens=False).ids, chunk
    assert len(chunks) > 50


async def test_token_ids_are_every_id_llama_server_generated_with_its_log_probs(llama_server, pieces) -> None:
    """Greedy: the ids equal llama-server's own non-streamed answer (the one place it reports every id), the
    log-probs its reported ones; the tokens llama-server withholds (incomplete UTF-8) are there too."""
    withheld = 0
    for prompt in PROMPTS:
        response = await uninterrupted(llama_server.url, prompt, "greedy")
        prompt_ids, ids, lps = token_info(response)
        async with httpx.AsyncClient(timeout=60) as client:
            whole = (
                await client.post(
                    f"{llama_server.url}/completion",
                    json={
                        "prompt": prompt_ids,
                        "n_predict": len(ids),
                        "temperature": 0,
                        "return_tokens": True,
                        "n_probs": 1,
                        "post_sampling_probs": False,
                        "cache_prompt": False,
                        "top_k": 0,
                        "min_p": 0,
                        "stream": False,
                    },
                )
            ).json()
        assert ids == whole["tokens"]
        missing = incomplete_positions(ids, pieces)
        withheld += len(missing)
        reported = whole["completion_probabilities"]  # llama-server leaves out the withheld tokens
        complete = [i for i in range(len(ids)) if i not in missing]
        assert [e["id"] for e in reported] == [ids[i] for i in complete]
        assert [e["logprob"] for e in reported] == [lps[i] for i in complete]
        assert all(lp <= 0 for lp in lps) and len(lps) == len(ids)
        assert (
            output_text(response).encode()
            == codecs.decode(b"".join(pieces[t] for t in ids), "utf-8", "replace").encode()
        )
    assert withheld > 0, "no prompt made a token end inside a multi-byte character: the pitfall went untested"


async def _continue(
    url: str, mode: str, prompt_ids: list[int], ids: list[int], lps: list[float], k: int, chat: dict[str, Any]
) -> tuple[list[int], list[float], str]:
    upstream = Upstream(UpstreamConfig(base_url=f"{url}/v1", engine="llama.cpp", extra_body=MODES[mode][1]))
    await upstream.start()
    try:
        request = upstream.engine.request(chat, Tokens.of(prompt_ids, ids[:k], lps[:k]), len(ids) - k)
        got_ids, got_lps, text = [], [], ""
        async with contextlib.aclosing(upstream.deltas(request, Halt())) as deltas:
            async for delta in deltas:
                got_ids += delta.generation_token_ids
                got_lps += delta.generation_log_probs
                text += delta.text
                if delta.prompt_token_ids is not None:
                    assert delta.prompt_token_ids == [*prompt_ids, *ids[:k]]
        return got_ids, got_lps, text
    finally:
        await upstream.close()


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_continuation_from_any_cut_equals_the_uninterrupted_generation(llama_server, pieces, mode) -> None:
    """Cut after every token that ends inside a multi-byte character and at random positions: continuing from
    the prompt ids + the prefix ids gives the uninterrupted tokens and text."""
    rng = random.Random(25)
    cuts_inside_characters = 0
    for prompt in PROMPTS:
        response = await uninterrupted(llama_server.url, prompt, mode)
        prompt_ids, ids, lps = token_info(response)
        inside = [i + 1 for i in incomplete_positions(ids, pieces) if i + 1 < len(ids)]
        cuts_inside_characters += len(inside)
        cuts = sorted(set(inside[:6] + rng.sample(range(1, len(ids)), 4)))
        chat = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], **MODES[mode][0]}
        for k in cuts:
            got_ids, got_lps, text = await _continue(llama_server.url, mode, prompt_ids, ids, lps, k, chat)
            assert got_ids == ids[k:], f"{mode}, cut at {k}"
            assert got_lps == lps[k:], f"{mode}, cut at {k}"
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            before = "".join(decoder.decode(pieces[t]) for t in ids[:k])
            assert before + text == output_text(response), f"{mode}, cut at {k}"
    assert cuts_inside_characters > 0


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_checkpoint_cuts_mid_generation_lose_nothing(llama_server, mode, tmp_path) -> None:
    """A final checkpoint cuts a running generation wherever it is; continued after its abort, the response is the
    uninterrupted one. A checkpoint the model resumes from leaves the stream running: the same response, nothing
    continued."""
    rng = random.Random(2025)
    prompt = PROMPTS[0]
    expected = await uninterrupted(llama_server.url, prompt, mode)
    total = len(token_info(expected)[1])
    async with serve(policy_app([llama_server.url], mode)) as client:
        control = Control(client)
        for n, at in enumerate(rng.sample(range(2, total // 2), 3)):
            rid, cid = f"r-cut-{mode}-{n}", f"ck-{mode}-{n}"
            call = asyncio.create_task(
                client.post("/v1/responses", json=responses_body(prompt, mode), headers=ident(rid))
            )
            await tokens_received(client, rid, at)
            assert (await control.prepare(cid, final=True))["status"] == "prepared"
            await control.capture(cid, f"file://{tmp_path / 'store'}", episodes=[rid], final=True)  # the capture cuts
            gen = generation_of(client, rid)
            assert gen is not None and gen.state in ("cut", "held")
            await control.persist(cid)
            await control.abort(cid)  # a final checkpoint that failed: the server serves on, the cut call continues
            response = await asyncio.wait_for(call, 120)
            assert response.status_code == 200, response.text
            assert_same_generation(response.json(), expected)
        live = (await control.status())["live"]
        assert live["generations_cut"] >= 1
        reused = live["tokens_reused"]

        rid = f"r-mark-{mode}"
        call = asyncio.create_task(client.post("/v1/responses", json=responses_body(prompt, mode), headers=ident(rid)))
        await tokens_received(client, rid, total // 3)
        assert (await control.prepare(f"ck-{mode}-mark"))["status"] == "prepared"
        await control.capture(f"ck-{mode}-mark", f"file://{tmp_path / 'store'}", episodes=[rid])
        assert generation_of(client, rid).state in ("running", "held")  # the stream goes on
        await control.resume(f"ck-{mode}-mark")
        response = await asyncio.wait_for(call, 120)
        assert response.status_code == 200, response.text
        assert_same_generation(response.json(), expected)
        assert (await control.status())["live"]["tokens_reused"] == reused  # nothing was continued


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_llama_server_killed_mid_generation_and_replaced(
    llama_binary, tiny, tmp_path, llama_server, mode
) -> None:
    """SIGKILL of the only llama-server mid-generation, a new one on its port: the generation continues from
    the ids it received and equals the uninterrupted one; nothing received is generated again."""
    from tests.support.llama_cpp import LlamaServer

    prompt = PROMPTS[1]
    expected = await uninterrupted(llama_server.url, prompt, mode)
    total = len(token_info(expected)[1])
    server = LlamaServer(llama_binary, tiny, tmp_path / "restartable")
    try:
        async with serve(policy_app([server.url], mode, upstream_retry=RETRY)) as client:
            call = asyncio.create_task(
                client.post("/v1/responses", json=responses_body(prompt, mode), headers=ident("r-kill"))
            )
            gen = await tokens_received(client, "r-kill", total // 3)
            server.kill()
            await wait_until(lambda: gen.waiting_for_upstream, what="the generation to wait for its upstream")
            kept = gen.completion_tokens
            assert kept < total
            server.restart()
            response = await asyncio.wait_for(call, 120)
            assert response.status_code == 200, response.text
            assert_same_generation(response.json(), expected)
            live = (await Control(client).status())["live"]
        assert live["tokens_reused"] == kept and live["tokens_generated"] == total
        assert live["upstream_failures"] >= 1
    finally:
        server.stop()


async def test_fleet_of_two_llama_servers_fails_over_token_exactly(llama_fleet, llama_server) -> None:
    """Two llama-servers behind one policy model: concurrent generations spread over both; one server is
    SIGKILLed mid-generation and every generation on it continues on the other, token-exactly."""
    mode = "seeded"
    expected = {p: await uninterrupted(llama_server.url, p, mode) for p in PROMPTS}
    async with serve(policy_app([s.url for s in llama_fleet], mode, upstream_retry=RETRY)) as client:
        calls = {
            f"r-fleet-{i}": asyncio.create_task(
                client.post("/v1/responses", json=responses_body(prompt, mode), headers=ident(f"r-fleet-{i}"))
            )
            for i, prompt in enumerate(PROMPTS * 2)
        }
        await tokens_received(client, "r-fleet-0", 10)
        llama_fleet[0].kill()
        responses = {rid: await asyncio.wait_for(call, 180) for rid, call in calls.items()}
        live = (await Control(client).status())["live"]
    for i, prompt in enumerate(PROMPTS * 2):
        response = responses[f"r-fleet-{i}"]
        assert response.status_code == 200, response.text
        # ids and log-probs exactly although several generations were served at once by each server and one of them
        # was killed mid-stream: a server runs one sequence at a time, in 1-token micro-batches
        assert_same_generation(response.json(), expected[prompt])
    assert live["upstream_failures"] >= 1
    total = sum(len(token_info(expected[p])[1]) for p in PROMPTS * 2)
    assert live["tokens_generated"] == total  # every token received once: none generated again after the failover
