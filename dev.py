#!/usr/bin/env python3
"""Bootstrap for a fresh machine with only Python >= 3.11 and pip.

    python3 dev.py demo     # create .venv on first use, install, run `gymckpt demo`
    python3 dev.py test     # same venv, run the test suite on 2-4 workers (extra args go to pytest; -n 0: one process)
    python3 dev.py gymckpt ARGS...   # any gymckpt command inside the venv
"""

from __future__ import annotations

import hashlib
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


def ensure_venv() -> None:
    """Create the venv and (re)install the project when pyproject.toml or docker/requirements.lock changed."""
    if sys.version_info < (3, 11):
        sys.exit(f"Python >= 3.11 is required, this is {sys.version.split()[0]}")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + LOCK.read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and (BIN / "gymckpt").exists():
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing gym-checkpoint and its pinned dependencies (first run only) ...", flush=True)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    try:
        subprocess.run([*pip, "-c", str(LOCK), "-e", f"{ROOT}[operator,local-s3,test]"], check=True)
    except subprocess.CalledProcessError:
        sys.exit("installing failed. If you changed a pin in pyproject.toml, update docker/requirements.lock to match: "
                 "python3 docker/lock.py")
    STAMP.write_text(wanted)


def parallel(pytest_args: list[str]) -> list[str]:
    """Run the suite on several workers (pytest-xdist) unless the caller chose (``-n``/``--numprocesses``):
    most tests wait on the servers they start, so two workers finish it in far less time even on 2 cores.
    Each worker keeps a test file together (its module fixtures are set up once)."""
    if "no:xdist" in pytest_args or any(a.startswith(("-n", "--numprocesses", "--dist")) for a in pytest_args):
        return []
    workers = min(4, max(2, os.cpu_count() or 1))
    return ["-n", str(workers), "--dist", "loadfile"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    ensure_venv()
    if command == "demo":
        args = [str(BIN / "gymckpt"), "demo", *rest]
    elif command == "test":
        args = [str(BIN / "python"), "-m", "pytest", *parallel(rest), *rest]
    elif command == "gymckpt":
        args = [str(BIN / "gymckpt"), *rest]
    else:
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    if os.name == "posix":
        # become the command: a signal sent to this process (`kill %1`, a supervisor) reaches it, and
        # its exit status is ours; a wrapper process would die alone and leave the command running
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(args[0], args)
    return subprocess.call(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
