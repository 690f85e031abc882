"""Imports go one way: a module imports only from its own layer or the layers below it.

    base -> control -> server -> servers (resources, agents, models, collection) -> coordination
         -> stack -> demo -> commands -> cli   |   gym_operator (kopf handlers, Kubernetes discovery, status)

``base`` imports nothing of ours; the CLI side and the operator never import each other. Every
import statement of every module counts, including imports inside functions and under
``TYPE_CHECKING``. ``docs/architecture.md`` explains the layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"gym_services": ROOT / "services" / "gym_services", "gym_operator": ROOT / "operator" / "gym_operator"}

#: lowest first; a module may import from its own layer and the ones before it
LAYERS: list[tuple[str, ...]] = [
    ("gym_services.base",),
    ("gym_services.control",),
    ("gym_services.server",),
    # the servers, and the adapters that make servers of other frameworks participants
    (
        "gym_services.resources",
        "gym_services.agents",
        "gym_services.models",
        "gym_services.collection",
        "gym_services.adapters",
    ),
    ("gym_services.coordination",),
    # the top: the local stack, the demo story, the CLI's commands and the CLI itself, and beside them the operator
    ("gym_services.stack", "gym_operator"),
    # the demo story, and the author's kit (the conformance harness drives a coordinator over real processes)
    ("gym_services.demo", "gym_services.authoring"),
    ("gym_services.commands",),
    ("gym_services.cli",),
]
#: units that must not import each other at any rank (the CLI never needs Kubernetes, the operator never the CLI)
APART = [
    {"gym_operator"},
    {"gym_services.stack", "gym_services.demo", "gym_services.authoring", "gym_services.commands", "gym_services.cli"},
]


def unit(module: str) -> str:
    """The layer unit a module belongs to: ``gym_operator`` or ``gym_services.<package>``."""
    parts = module.split(".")
    return parts[0] if parts[0] == "gym_operator" else ".".join(parts[:2])


def rank(module: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit(module) in units:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def modules() -> Iterator[tuple[str, Path]]:
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def imported(module: str, source: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module of ours that ``source`` imports, with its line (``from a import b`` counts ``a.b`` too)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES and name not in PACKAGES:
                yield name, node.lineno


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    found = []
    for target, line in imported(module, source, is_package):
        if unit(target) == unit(module):
            continue
        if rank(target) > rank(module):
            found.append(f"{module}:{line} imports {target} from a higher layer")
        elif any(
            unit(module) in group and unit(target) in other for group in APART for other in APART if other is not group
        ):
            found.append(f"{module}:{line} imports {target}: the operator and the CLI side never import each other")
    return found


def test_every_import_goes_down() -> None:
    found = [v for module, path in modules() for v in violations(module, path.read_text(), path.name == "__init__.py")]
    assert not found, "\n".join(found)


def test_every_package_has_a_layer() -> None:
    for module, _ in modules():
        if module not in PACKAGES:
            rank(module)


def test_the_check_sees_upward_imports() -> None:
    """The check itself: each kind of wrong import is caught, right ones are not."""
    assert violations("gym_services.base.errors", "from gym_services.control import models")
    assert violations(
        "gym_services.control.plane", "def f():\n    from gym_services.server.app import create_server_app"
    )
    assert violations("gym_services.resources.counter.app", "import gym_services.coordination.client")
    assert violations("gym_services.coordination.coordinator", "from gym_services.stack import launcher")
    assert violations("gym_services.commands.stack", "from gym_operator.handlers import Transaction")
    assert violations("gym_operator.handlers", "from gym_services.commands.output import table")
    assert violations("gym_operator.handlers", "from gym_services.stack.launcher import read_state")
    assert violations("gym_services.stack.discovery", "from gym_operator.discovery import participants_from_pods")
    assert violations("gym_services.demo.report", "from gym_services.commands.output import table")
    assert violations("gym_services.control.routes", "from ..server import app")
    assert not violations("gym_services.control.routes", "from ..base import errors")
    assert not violations("gym_operator.handlers", "from gym_services.coordination.coordinator import Coordinator")
    assert not violations("gym_services.agents.common.steps", "from gym_services.control.protocol import VERIFY_HEADER")
