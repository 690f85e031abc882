"""Running ``gymckpt`` as a user does, in a stack folder, for the CLI tests of this package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def gymckpt(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``gymckpt ARGS`` in ``cwd`` with its stack state there; never a traceback, exit 0 unless ``check`` is off."""
    proc = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GYMCKPT_STATE_DIR": str(cwd / ".gymckpt/stack")},
    )
    if check:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc
