"""The tiny llama model the engine tests generate: a real llama GGUF and its BPE tokenizer, the same bytes every
time."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
from tokenizers import Tokenizer

from gym_services.models.llama_cpp.tiny_model import SPECIAL_TOKENS, TinyShape, ensure_tiny_model


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_model_is_a_llama_gguf_of_the_asked_shape_with_its_tokenizer(tmp_path: Path) -> None:
    shape = TinyShape()
    model = ensure_tiny_model(tmp_path / "a")
    reader = gguf.GGUFReader(str(model.gguf))

    def field(name: str):
        part = reader.fields[name]
        value = part.parts[part.data[0]]
        return bytes(value).decode() if part.types[0] == gguf.GGUFValueType.STRING else value[0]

    assert field("general.architecture") == "llama"
    assert (field("llama.block_count"), field("llama.embedding_length"), field("llama.feed_forward_length")) == (
        2,
        128,
        256,
    )
    assert (
        field("llama.attention.head_count"),
        field("llama.attention.head_count_kv"),
        field("llama.context_length"),
    ) == (4, 2, 8192)
    assert (field("tokenizer.ggml.model"), field("tokenizer.ggml.pre")) == ("gpt2", "gpt-2")
    tensors = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert tensors["token_embd.weight"] == (shape.hidden, shape.vocab_size)  # GGUF lists the fastest dimension first
    assert tensors["blk.1.attn_k.weight"] == (shape.hidden, shape.hidden // shape.heads * shape.kv_heads)
    assert len(tensors) == 2 + shape.layers * 9 + 1
    assert 4_000_000 < model.gguf.stat().st_size < 7_000_000

    tokenizer = Tokenizer.from_file(str(model.tokenizer))
    assert tokenizer.get_vocab_size() == shape.vocab_size
    assert all(tokenizer.token_to_id(t) is not None for t in SPECIAL_TOKENS)
    text = "Größe 日本語 🙂 <|im_end|>"
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(encoded.ids, skip_special_tokens=False) == text
    # byte-level pieces split multi-byte characters: some token of this text ends inside one
    assert any(not tokenizer.decode([i]).isprintable() or "\ufffd" in tokenizer.decode([i]) for i in encoded.ids)


def test_the_model_is_made_once_per_content_and_the_same_everywhere(tmp_path: Path) -> None:
    first = ensure_tiny_model(tmp_path / "a")
    made = first.gguf.stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "a").gguf.stat().st_mtime_ns == made  # cached: not written again
    second = ensure_tiny_model(tmp_path / "b")  # another cache: made again, byte for byte the same
    assert _digest(second.gguf) == _digest(first.gguf) and _digest(second.tokenizer) == _digest(first.tokenizer)
    assert first.folder.name == second.folder.name
