"""Fixtures for the Kubernetes emulator tests (kemu lives beside this file, in tests/k8s/kemu)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from kemu.fixtures import kemu, kemu_shared, kubectl, kubectl_shared  # noqa: E402,F401
