"""The oracle itself: the reference wheel is the released one and runs with its lock file's pandas."""

from __future__ import annotations

import pytest

from tests.conformance.oracle.client import Oracle, OracleError
from tests.conformance.oracle.reference import ORACLE_PYTHON, ORACLE_REQUIREMENTS, WHEEL_VERSION, Interpreter


def test_oracle_runs_the_lock_files_versions(oracle: Oracle) -> None:
    wanted = dict(req.split("==") for req in ORACLE_REQUIREMENTS if "==" in req)
    got = oracle.call("smoke", "versions")
    assert {name: got[name] for name in got if name in wanted} == {name: wanted[name] for name in got if name in wanted}
    assert got["nemo-gym"] == WHEEL_VERSION  # installed with --ignore-requires-python


def test_oracle_runs_on_the_python_the_wheel_requires(oracle: Oracle, oracle_runtime: Interpreter) -> None:
    """3.13 (the wheel requires >= 3.13.14); on a machine without one, the fallback is this interpreter and the
    run warns (OracleFallbackWarning, terminal summary)."""
    got = tuple(int(p) for p in oracle.call("smoke", "versions")["python"].split(".")[:2])
    if oracle_runtime.fallback is None:
        assert got == ORACLE_PYTHON
    else:
        assert got != ORACLE_PYTHON and "no Python 3.13" in oracle_runtime.fallback


def test_the_wheels_minimum_pins_are_met() -> None:
    """Every package the wheel requires at a minimum version and the oracle pins is pinned at or above it."""
    import zipfile

    from packaging.requirements import Requirement
    from packaging.version import Version

    from tests.conformance.oracle.reference import WHEEL_NAME, cache_dir, reference_root

    reference_root()
    with zipfile.ZipFile(cache_dir() / "wheels" / WHEEL_NAME) as zf:
        meta = zf.read(f"nemo_gym-{WHEEL_VERSION}.dist-info/METADATA").decode()
    pins = {Requirement(r).name.lower(): Version(r.split("==")[1]) for r in ORACLE_REQUIREMENTS}
    checked = 0
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = Requirement(line.split(":", 1)[1].strip())
            if req.name.lower() in pins:
                assert req.specifier.contains(pins[req.name.lower()]), (req, pins[req.name.lower()])
                checked += 1
    assert checked >= 8


def test_reference_modules_import_unmodified(oracle: Oracle, reference) -> None:
    assert (reference / "resources_servers" / "workplace_assistant" / "workplace_assistant_tools").is_dir()
    oracle.call("smoke", "reference_imports")


def test_glue_failure_is_reported_not_swallowed(oracle: Oracle) -> None:
    with pytest.raises(OracleError, match="AttributeError"):
        oracle.call("smoke", "no_such_function")
