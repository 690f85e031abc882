"""Style and types as CI checks them: ``ruff check`` and ``ruff format --check`` over the repository, ``mypy``
over services/ and operator/ (settings: ``[tool.ruff]`` and ``[tool.mypy]`` in pyproject.toml; the versions are
pinned in its ``test`` extra, so every machine checks with the same rules).

Each runs from the repository root with this environment's Python, as a developer runs it:

    .venv/bin/python -m ruff check .   # --fix for what it can fix; .venv/bin/python -m ruff format . to format
    .venv/bin/python -m mypy

Their caches (.ruff_cache/, .mypy_cache/) stay in the repository root, ignored by git: a later run only looks
at what changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECKS = {
    "ruff-check": ["ruff", "check", "."],
    "ruff-format": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
}


@pytest.mark.parametrize("check", CHECKS)
def test_the_tree_is_clean(check: str) -> None:
    command = [sys.executable, "-m", *CHECKS[check]]
    # a cold mypy run over every dependency takes about a minute on a slow machine; the bound is for a hang
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"`{' '.join(CHECKS[check])}` (run from {ROOT}) found problems:\n{result.stdout}{result.stderr}")
