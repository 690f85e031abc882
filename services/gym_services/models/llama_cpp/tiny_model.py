"""A tiny llama-architecture model made on this machine, for a real inference engine with no download.

:func:`ensure_tiny_model` trains a byte-level BPE tokenizer (4,096 tokens with ChatML's special tokens)
on text shipped in this package and writes a GGUF file llama.cpp loads: 2 layers, hidden size 128,
4 attention heads sharing 2 key/value heads, FFN 256, context 2,048, weights drawn from a fixed seed.
The weights are random, so the text is gibberish, but everything an engine does with a real model
happens: BPE tokenization with merges, chat templating, tokens that end inside a multi-byte UTF-8
character, log-probs from a softmax over the whole vocabulary.

The files are made once per content (the generator's version, the training text and the shape are in
the folder name) into a cache folder, in about 3 seconds, with no torch. ``tokenizers`` and ``gguf``
come with the ``engine`` extra (``pip install gym-checkpoint[engine]``); nothing else of the project
imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PACKAGE = Path(__file__).resolve().parents[2]

#: bump when the files this module writes change for the same inputs
GENERATOR_VERSION = 1
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
#: ChatML, the format of the policy model's chat requests (tools are rendered into the system message)
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- 'Tools:\\n' }}{%- for tool in tools %}{{- tool | tojson + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- set skip_first = messages[0]['role'] == 'system' %}{%- else %}{%- set skip_first = false %}{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and skip_first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] %}{%- for part in message['content'] %}"
    "{{- part['text'] if part['text'] is defined else '' }}{%- endfor %}{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}{%- for call in message['tool_calls'] %}"
    "{{- '<tool_call>' + (call['function'] | tojson) + '</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: characters of several scripts and widths, so the merges learn pieces of 2-, 3- and 4-byte characters
MULTILINGUAL = (
    "Größe, Maß und Übermut — café, naïve, façade, Ærø, smørbrød. Привет, как дела? Ελληνικά γράμματα. "
    "日本語の文章と漢字。中文的句子和标点。한국어 문장입니다. عربى نص. עברית טקסט. हिन्दी पाठ. "
    "Emoji: 🙂 🚀 🎲 🃏 ♠♥♦♣ → ← ↑ ↓ ≤ ≥ ≠ ∀ ∃ ∑ ∫ √ ∞ ∈ ∉ ⊂ ⊆ ∧ ∨ ¬ ⇒ ⟨x⟩ ℕ ℤ ℚ ℝ. "
)


@dataclass(frozen=True)
class TinyShape:
    """The model's shape (llama architecture)."""

    vocab_size: int = 4096
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    context: int = 8192  # llama-server caps a slot at it: the demo's Workplace prompts are 4,300 tokens
    seed: int = 20240601


@dataclass(frozen=True)
class TinyModel:
    """The generated files: ``gguf`` for llama.cpp, ``tokenizer`` (``tokenizer.json``) for local tokenizing."""

    folder: Path
    gguf: Path
    tokenizer: Path
    shape: TinyShape


class EngineExtraMissing(RuntimeError):
    """``tokenizers``/``gguf`` are not installed: the ``engine`` extra is needed."""


def training_text() -> str:
    """The tokenizer's training text: the package's own documents and example data, and :data:`MULTILINGUAL`."""
    parts = []
    for pattern in ("**/*.md", "**/data/*.jsonl"):
        for path in sorted(PACKAGE.glob(pattern)):
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    parts.extend([MULTILINGUAL] * 20)
    return "\n".join(parts)


def default_cache() -> Path:
    """``$GYMCKPT_CACHE`` or ``~/.cache/gym-checkpoint``."""
    root = os.environ.get("GYMCKPT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "gym-checkpoint"


def ensure_tiny_model(cache: Path | None = None, shape: TinyShape = TinyShape()) -> TinyModel:
    """The tiny model's files under ``cache`` (made there on first use; safe with concurrent callers)."""
    text = training_text()
    digest = hashlib.sha256(
        json.dumps({"v": GENERATOR_VERSION, "shape": asdict(shape)}).encode() + text.encode()
    ).hexdigest()[:16]
    folder = (cache or default_cache()) / f"tiny-llama-{digest}"
    model = TinyModel(folder, folder / "model.gguf", folder / "tokenizer.json", shape)
    if model.gguf.exists() and model.tokenizer.exists():
        return model
    try:
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise EngineExtraMissing(
            f"the tiny model needs the engine extra ({exc.name} is missing): pip install 'gym-checkpoint[engine]'"
        ) from None
    folder.parent.mkdir(parents=True, exist_ok=True)
    # built in a private folder, then renamed into place: a concurrent caller sees all files or none
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        tokenizer = train_tokenizer(text, shape.vocab_size)
        tokenizer.save(str(work / "tokenizer.json"))
        write_gguf(work / "model.gguf", tokenizer, shape)
        try:
            work.rename(folder)
        except OSError:
            if not model.gguf.exists():  # not a concurrent caller that finished first
                raise
    finally:
        if work.exists():
            for path in work.iterdir():
                path.unlink()
            work.rmdir()
    return model


def train_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2's pre-tokenizer, no prefix space) with ChatML's special tokens, ``vocab_size`` in all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = text.splitlines(keepends=True)
    tokenizer.train_from_iterator([lines[i : i + 64] for i in range(0, len(lines), 64)], trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the training text gave {tokenizer.get_vocab_size()} tokens, not {vocab_size}")
    return tokenizer


def write_gguf(path: Path, tokenizer: Tokenizer, shape: TinyShape) -> None:
    """A llama GGUF (F32) with ``tokenizer``'s vocabulary and merges, weights from ``shape.seed``."""
    import gguf
    import numpy as np

    state = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    for added in state["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [""] * shape.vocab_size
    for piece, index in vocab.items():
        tokens[index] = piece
    if any(t == "" for t in tokens):
        raise RuntimeError("the tokenizer's ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    special = {vocab[t] for t in SPECIAL_TOKENS}

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("gym-checkpoint tiny llama (random weights)")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[END_OF_TEXT])
    writer.add_eos_token_id(vocab[IM_END])
    writer.add_eot_token_id(vocab[IM_END])
    writer.add_pad_token_id(vocab[END_OF_TEXT])
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(shape.seed)

    def normal(std: float, *dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    h, kv = shape.hidden, shape.hidden // shape.heads * shape.kv_heads
    # numpy shapes are (rows, columns) = (outputs, inputs); logits of std ~1 keep greedy choices far from ties
    writer.add_tensor("token_embd.weight", normal(1.0, shape.vocab_size, h))
    for layer in range(shape.layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", normal(h**-0.5, h, h))
        writer.add_tensor(f"{prefix}.attn_k.weight", normal(h**-0.5, kv, h))
        writer.add_tensor(f"{prefix}.attn_v.weight", normal(h**-0.5, kv, h))
        writer.add_tensor(f"{prefix}.attn_output.weight", normal(h**-0.5, h, h))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", normal(h**-0.5, shape.ffn, h))
        writer.add_tensor(f"{prefix}.ffn_up.weight", normal(h**-0.5, shape.ffn, h))
        writer.add_tensor(f"{prefix}.ffn_down.weight", normal(shape.ffn**-0.5, h, shape.ffn))
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    writer.add_tensor("output.weight", normal(1.5 * h**-0.5, shape.vocab_size, h))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
