"""A throwaway virtual environment that sees everything this one has (gym-checkpoint and its dependencies) and takes
packages of its own: a third-party server package is installed into it, never into the suite's own venv, which
other tests read at the same time."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path


def layered_venv(target: Path) -> Path:
    """A venv at ``target`` layered over this interpreter's site-packages, with a ``gymckpt`` script; its bin folder."""
    subprocess.run([sys._base_executable, "-m", "venv", str(target)], check=True, capture_output=True, timeout=300)  # type: ignore[attr-defined]
    python = target / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    parent = site.getsitepackages()[0]
    Path(own, "_suite_layer.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    script = target / "bin" / "gymckpt"
    script.write_text(f'#!/bin/sh\nexec "{python}" -m gym_services.cli "$@"\n')
    script.chmod(0o755)
    return target / "bin"
