"""The operator tests use the Kubernetes emulator (kemu) that lives in tests/k8s."""

import sys
from pathlib import Path

_K8S = str(Path(__file__).resolve().parents[1] / "k8s")
if _K8S not in sys.path:
    sys.path.insert(0, _K8S)

from kemu.fixtures import kemu, kubectl  # noqa: E402,F401
