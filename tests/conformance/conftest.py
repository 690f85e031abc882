"""Conformance against NeMo Gym 0.7.0: the released reference is the oracle (see oracle/reference.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.reference import oracle_python, reference_root


@pytest.fixture(scope="session")
def reference() -> Path:
    """The unpacked NeMo Gym wheel (downloaded once into the cache)."""
    return reference_root()


@pytest.fixture(scope="session")
def oracle(reference: Path) -> Iterator[Oracle]:
    """One driver process in the oracle environment for the whole session, serving every glue (each
    imports NeMo Gym's real framework through ``oracle/framework.py``); killed at the end."""
    proc = Oracle(oracle_python(), reference)
    try:
        yield proc
    finally:
        proc.close()
