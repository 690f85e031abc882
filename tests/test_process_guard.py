"""The process-leak guard (tests/conftest.py, tests/support/processes.py) sees what fixtures start, not only test
functions: a process a function-scoped fixture started and never stopped fails its test, one a module- or
session-scoped fixture left running fails that fixture's teardown; each is killed. A fixture that stops what it started,
and a broader fixture's process still in use by later tests, are no leak.

The guarded tests run in a pytest of their own (the guard as a plugin, ``-p tests.conftest``), so their failures are
what this test reads."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.processes import GRACE_ENV

ROOT = Path(__file__).resolve().parents[1]

GUARDED = textwrap.dedent("""
    import os, subprocess, sys
    import pytest

    PIDS = os.environ["GUARD_PIDS"]

    def start(name):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", name])
        with open(PIDS, "a") as fh:
            fh.write(f"{name} {proc.pid}\\n")
        return proc

    @pytest.fixture
    def forgotten():
        yield start("function-fixture-leak")  # never stopped

    @pytest.fixture
    def tidy():
        proc = start("function-fixture-tidy")
        yield proc
        proc.kill()
        proc.wait()

    @pytest.fixture(scope="module")
    def shared():
        yield start("module-fixture-leak")  # never stopped: outlives every test of the module

    @pytest.fixture(scope="session")
    def everywhere():
        yield start("session-fixture-leak")  # never stopped

    def test_a_function_fixture_leaks(forgotten):
        pass

    def test_a_tidy_fixture(tidy, shared):
        assert shared.poll() is None

    def test_the_module_fixture_lives_on_between_tests(shared, everywhere):
        assert shared.poll() is None  # not killed as the previous test's leak
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_processes_fixtures_leave_running_are_killed_and_fail(tmp_path) -> None:
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    pids = tmp_path / "pids.txt"
    env = {**os.environ, "GUARD_PIDS": str(pids), "PYTHONPATH": str(ROOT), GRACE_ENV: "0.2"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_guarded.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    started = dict(line.split() for line in pids.read_text().splitlines())
    try:
        assert "ERROR at teardown of test_a_function_fixture_leaks" in out, out
        assert "started by this test or its fixtures were left running" in out and "function-fixture-leak" in out, out
        assert "fixture 'shared' (module scope)" in out and "module-fixture-leak" in out, out
        assert "fixture 'everywhere' (session scope)" in out and "session-fixture-leak" in out, out
        assert "function-fixture-tidy" not in out  # stopped by its fixture: no leak
        assert "3 passed, " in out and " error" in out, out  # the leaks are errors; the tests themselves pass
        deadline = time.monotonic() + 5
        while any(_alive(int(pid)) for pid in started.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [name for name, pid in started.items() if _alive(int(pid))]
    finally:
        for pid in started.values():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
