"""Fixtures for the chart tests: the Kubernetes emulator (tests/k8s/kemu) for `helm install`."""

import copy
import json
import sys
from pathlib import Path

_KEMU_HOME = str(Path(__file__).resolve().parents[1] / "k8s")
if _KEMU_HOME not in sys.path:
    sys.path.insert(0, _KEMU_HOME)

from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402
from kemu.fixtures import kemu, kubectl  # noqa: E402,F401

CHART = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint"

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def helm_chart() -> Iterator[Any]:
    """The chart loaded once by real Helm (helm-python-sdk)."""
    helm = pytest.importorskip("helm_python")
    with helm.Chart.load(str(CHART)) as chart:
        yield chart


#: libyaml's safe loader where PyYAML has it (the same documents, parsed ~10x faster than in pure Python)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.fixture(scope="session")
def render(helm_chart: Any) -> Render:
    """`render(values, name='demo', namespace='prod')` -> every rendered manifest as a dict (a copy of its own:
    the documents of each distinct render are parsed once per session, and a test may change what it gets)."""
    parsed: dict[str, list[dict[str, Any]]] = {}

    def run(values: dict[str, Any] | None = None, name: str = "demo", namespace: str = "prod") -> list[dict[str, Any]]:
        key = json.dumps([values or {}, name, namespace], sort_keys=True)
        if key not in parsed:
            files = helm_chart.render(values or {}, name=name, namespace=namespace)
            docs = []
            for filename, text in sorted(files.items()):
                if filename.endswith(".txt"):
                    continue
                docs.extend(doc for doc in yaml.load_all(text, Loader=LOADER) if doc)
            parsed[key] = docs
        return copy.deepcopy(parsed[key])

    return run
