"""Conformance against NeMo Gym 0.7.0: the released reference is the oracle (see oracle/reference.py).

The oracle runs on the Python its wheel requires (3.13, found by ``oracle_interpreter``); on a machine without
one it runs on this interpreter, and the run says so: a ``OracleFallbackWarning`` (in the warnings summary, also
from xdist workers) and a banner at the end of the terminal summary.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.oracle.client import Oracle
from tests.conformance.oracle.reference import Interpreter, oracle_interpreter, oracle_python, reference_root


class OracleFallbackWarning(UserWarning):
    """The reference ran on a Python other than the one its wheel requires."""


_chosen: list[Interpreter] = []


@pytest.fixture(scope="session")
def reference() -> Path:
    """The unpacked NeMo Gym wheel (downloaded once into the cache)."""
    return reference_root()


@pytest.fixture(scope="session")
def oracle_runtime() -> Interpreter:
    """The interpreter the oracle venv is built on (3.13, or the fallback with its reason, warned)."""
    interpreter = oracle_interpreter()
    _chosen.append(interpreter)
    if interpreter.fallback:
        warnings.warn(OracleFallbackWarning(interpreter.fallback), stacklevel=1)
    return interpreter


@pytest.fixture(scope="session")
def oracle(reference: Path, oracle_runtime: Interpreter) -> Iterator[Oracle]:
    """One driver process in the oracle environment for the whole session, serving every glue (each
    imports NeMo Gym's real framework through ``oracle/framework.py``); killed at the end."""
    proc = Oracle(oracle_python(oracle_runtime), reference)
    try:
        yield proc
    finally:
        proc.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for interpreter in _chosen[:1]:
        if interpreter.fallback:
            terminalreporter.section("NeMo Gym oracle on the wrong Python", sep="!", red=True, bold=True)
            terminalreporter.write_line(interpreter.fallback, red=True, bold=True)
