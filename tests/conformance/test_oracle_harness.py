"""The oracle itself: the reference wheel is the released one and runs with its lock file's pandas."""

from __future__ import annotations

from tests.conformance.oracle.client import Oracle, OracleError
from tests.conformance.oracle.reference import ORACLE_REQUIREMENTS

import pytest


def test_oracle_runs_the_lock_files_versions(oracle: Oracle) -> None:
    wanted = dict(req.split("==") for req in ORACLE_REQUIREMENTS if "==" in req)
    got = oracle.call("smoke", "versions")
    assert got["pandas"] == wanted["pandas"] and got["numpy"] == wanted["numpy"]


def test_reference_modules_import_unmodified(oracle: Oracle, reference) -> None:
    assert (reference / "resources_servers" / "workplace_assistant" / "workplace_assistant_tools").is_dir()
    oracle.call("smoke", "reference_imports")


def test_glue_failure_is_reported_not_swallowed(oracle: Oracle) -> None:
    with pytest.raises(OracleError, match="AttributeError"):
        oracle.call("smoke", "no_such_function")
