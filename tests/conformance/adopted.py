"""NeMo Gym servers from the wheel, adopted in place: the environment they run in and their adopted copies.

- :func:`project_wheel` builds gym-checkpoint's wheel from this checkout (what ``pip install gym-checkpoint`` gets).
- :func:`adopted_python` makes a virtual environment on the oracle's interpreter that sees everything the oracle venv
  holds (NeMo Gym 0.7.0 and the versions it pins, ``reference.ORACLE_REQUIREMENTS``) and installs the wheel into it
  the way an author of a NeMo Gym server would (``pip install``), constrained to the oracle venv's versions: the
  server runs on NeMo Gym's own Starlette, FastAPI, pydantic and uvicorn. The packages NeMo Gym's framework imports
  but no server here uses (hydra, ray ...) are the oracle's import shims (``oracle/framework.py``), installed by a
  ``.pth`` file.
- :func:`adopted_copy` copies one server's ``app.py`` from the unpacked wheel into a package of its own and appends
  the lines that adopt it; nothing else of the file changes.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conformance.oracle.client import GLUE_DIR

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=900, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def project_wheel(target: Path) -> Path:
    """gym-checkpoint's wheel, built from a copy of the checkout's sources (no build files left in the checkout)."""
    source = target / "source"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("services", "operator"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", target / "wheels", source)
    (wheel,) = (target / "wheels").glob("gym_checkpoint-*.whl")
    return wheel


def adopted_python(oracle_python: Path, wheel: Path, target: Path) -> Path:
    """A venv layered over the oracle venv, with gym-checkpoint installed from ``wheel``; returns its python."""
    base = Path(_run(oracle_python, "-c", "import sys; print(sys._base_executable)").strip())
    site = _run(oracle_python, "-c", "import site; print(site.getsitepackages()[0])").strip()
    venv = target / "adopted-venv"
    _run(base, "-m", "venv", venv)
    python = venv / "bin" / "python"
    own_site = Path(_run(python, "-c", "import site; print(site.getsitepackages()[0])").strip())
    (own_site / "_oracle_layer.pth").write_text(f"import site; site.addsitedir({site!r})\n")
    shims = f"import sys; sys.path.append({str(GLUE_DIR)!r}); import framework; framework.install_import_shims()\n"
    (own_site / "zz_oracle_shims.pth").write_text(shims)
    constraints = target / "constraints.txt"
    constraints.write_text(_constraints(oracle_python))
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", constraints, wheel)
    return python


def _constraints(oracle_python: Path) -> str:
    """The project's lock, where the oracle venv has a package at another version that version: every package NeMo
    Gym's environment holds stays as it is, and what gym-checkpoint adds gets the lock's version."""
    spec = importlib.util.spec_from_file_location("docker_lock", ROOT / "docker" / "lock.py")
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {}
    for line in lock.constraints((ROOT / "docker" / "requirements.lock").read_text()).splitlines():
        if "==" in line:
            pins[canonical(line.split("==")[0])] = line
    for line in _run(oracle_python, "-m", "pip", "freeze", "--disable-pip-version-check").splitlines():
        if "==" in line and not line.lower().startswith("nemo"):
            pins[canonical(line.split("==")[0])] = line
    return "\n".join(sorted(pins.values())) + "\n"


#: the lines appended to a server's app.py to adopt it ({server_class}, {state}: the server's own names)
ADOPTION = """

# gym-checkpoint: this server takes part in checkpoints (docs/authoring.md, "A NeMo Gym server")
from gym_services.adapters.nemo_gym import SessionDict, adopt  # noqa: E402

Config, create_app = adopt({server_class}, {state})
"""


def adopted_copy(reference: Path, server: str, server_class: str, state: str, target: Path) -> tuple[str, int]:
    """``resources_servers/<server>/app.py`` of the wheel with the adoption appended, as package ``adopted_<server>``
    under ``target``; returns its import path for ``gymckpt serve`` and the number of lines added (not blank)."""
    package = target / f"adopted_{server}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    original = (reference / "resources_servers" / server / "app.py").read_text()
    added = ADOPTION.format(server_class=server_class, state=state)
    (package / "app.py").write_text(original + added)
    return f"adopted_{server}.app:create_app", sum(1 for line in added.splitlines() if line.strip())
