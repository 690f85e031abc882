"""Fixtures for the chart tests: the Kubernetes emulator (tests/k8s/kemu) for `helm install`."""
import sys
from pathlib import Path

_KEMU_HOME = str(Path(__file__).resolve().parents[1] / 'k8s')
if _KEMU_HOME not in sys.path:
    sys.path.insert(0, _KEMU_HOME)

from kemu.fixtures import kemu, kubectl  # noqa: E402,F401
