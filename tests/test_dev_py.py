"""``dev.py``, the bootstrap the README's two commands go through."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.services.models.procs import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.name != "posix", reason="exec is how dev.py hands over on POSIX")
def test_killing_the_dev_py_process_stops_the_command_it_runs(tmp_path) -> None:
    """`python3 dev.py gymckpt serve ...` in the background, then `kill` of that process: the server stops
    (dev.py became the server) instead of running on as an orphan."""
    port = free_port()
    env = {**os.environ, "GYMCKPT_CONTROL_TOKEN": "t" * 16, "GYMCKPT_SESSION_SECRET": "s" * 32}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "gymckpt", "serve", "counter", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/health/live"
    try:
        deadline = time.monotonic() + 120  # dev.py may first check the venv
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            assert proc.poll() is None, "dev.py exited before the server answered"
            time.sleep(0.1)
        else:
            raise AssertionError("the server never answered")
        proc.kill()  # this process only, as `kill PID` of a background job does
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        answering = True
        while answering and time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                time.sleep(0.1)
            except httpx.HTTPError:
                answering = False
        assert not answering, "the server kept running after its dev.py process was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: an orphaned server too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def test_the_suite_runs_on_workers_unless_the_caller_chooses(monkeypatch) -> None:
    """`python3 dev.py test` spreads test files over 2-4 xdist workers; `-n`, `--dist` or `-p no:xdist` given by the
    caller win (no second `-n`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev_py", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    for cores, workers in ((1, "2"), (2, "2"), (16, "4")):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert dev.parallel(["-q", "-p", "no:cacheprovider"]) == ["-n", workers, "--dist", "loadfile"]
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"], ["-p", "no:xdist"]):
        assert dev.parallel(["-q", *chosen]) == []
