"""Imports go one way: between packages, inside the packages that have floors of their own, and never in a circle.

    base -> control -> server -> servers (resources, agents, models, collection) -> coordination
         -> stack -> demo -> commands -> cli   |   gym_operator (kopf handlers, Kubernetes discovery, status)

``base`` imports nothing of ours; the CLI side and the operator never import each other. Inside ``control/``,
``control/storage/`` and ``models/policy_model/`` the modules stand on floors (:data:`FLOORS`): a module imports
from its own floor and the floors below it, never from a floor above, and a package's modules never import its
``__init__`` (the package's front door). Over all of it, no module reaches itself through its imports: the import
graph of ``services/`` and ``operator/`` has no circle (:func:`circles`). Every import statement of every module
counts, including imports inside functions and under ``TYPE_CHECKING``. ``docs/architecture.md`` ("Layers")
explains the order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache
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

#: inside a package: its modules and subpackages (by their name in it) on floors, lowest first
FLOORS: dict[str, list[tuple[str, ...]]] = {
    "gym_services.control": [
        ("protocol", "layout", "fencing", "metrics"),  # the vocabulary: names, phases, storage keys, counters
        ("models",),  # the wire and file models
        ("interfaces",),  # what a server implements, checked against an interface at start-up
        ("participant",),  # the participant interface and its record encoder
        ("storage", "encoding", "gc_pause"),  # storage backends; encoding frozen records; no collection under the pause
        ("manifests",),  # the stored documents read back, and their digest
        ("store",),  # the store: checkpoints in the protocol's words
        ("retention", "packs"),  # deletion and garbage collection; the packed format's writer and reader
        # the plane's collaborators: reading records back, background uploads, storage clients, admission, ...
        ("records", "persists", "storage_clients", "admission", "lease", "phases", "repeats", "termination"),
        # the checkpoint open on the server: its phase, lease, calls, what is in progress; a final one, held
        ("open_checkpoint", "final"),
        ("checkpointing", "closing"),  # prepare, capture, persist; resume and abort
        ("restoring",),  # restore, and settling it by its decision object
        ("plane",),  # the control plane
        ("routes",),  # its HTTP routes
    ],
    "gym_services.control.storage": [
        ("base",),  # the interface and its errors
        ("file", "s3", "memory", "gateway"),  # the backends (a participant's through the storage gateway)
        ("locations",),  # opening a location by its URL
    ],
    "gym_services.models.policy_model": [
        ("earlier_prefixes",),  # the prefix records earlier code wrote, read only
        ("engines", "fleet", "prefixes", "responses", "stream_events"),  # wire adapters, workers, API forms, events
        ("upstream",),  # one streamed call to the inference workers
        ("generations",),  # generations, their cuts and token prefixes
        ("ledger",),  # the token ledger
        ("participant",),  # the policy model's checkpoint participant
        ("app",),  # the server
    ],
    "gym_services.models.policy_model.engines": [
        ("base",),  # the engine interface and its values
        ("sse",),  # the base of the engines that stream server-sent events
        ("llama_cpp", "vllm"),  # one adapter per engine
    ],
    "gym_services.models.policy_model.ledger": [
        ("wire",),  # the ledger's wire models
        ("lineage", "client", "entries"),  # resolving a rollout's lineage; the typed client; entries' stored form
        ("rollouts",),  # the token ledger of every rollout
        ("recording", "records", "routes"),  # recording a call; the checkpoint records; the HTTP routes
    ],
}


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


@cache
def known_modules() -> frozenset[str]:
    return frozenset(name for name, _ in modules())


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


def modules_imported(module: str, source: str, is_package: bool = False) -> Iterator[tuple[str, int]]:
    """The modules ``source`` imports: ``from a import b`` is module ``a.b`` when there is one, else ``a``'s
    ``__init__``; a name of no known module counts as written (synthetic sources in the tests)."""
    known = known_modules()
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES and target != module:
                yield target, node.lineno


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


def floor(package: str, module: str) -> int:
    """The floor of ``module`` (inside ``package``, not its ``__init__``) among the package's :data:`FLOORS`."""
    name = module[len(package) + 1 :].split(".")[0]
    for index, names in enumerate(FLOORS[package]):
        if name in names:
            return index
    raise AssertionError(f"{module} is on no floor of {package}: add {name!r} to FLOORS[{package!r}]")


def floor_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Imports of a module against the floors of every package with floors that holds it."""
    found = []
    for package in FLOORS:
        if not module.startswith(package + "."):
            continue
        for target, line in modules_imported(module, source, is_package):
            if target == package:
                found.append(f"{module}:{line} imports {package}, its own package's front door")
            elif target.startswith(package + ".") and floor(package, target) > floor(package, module):
                found.append(f"{module}:{line} imports {target} from a higher floor of {package}")
    return found


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The circles of an import graph (module -> modules it imports): every group of modules that reach each other,
    each sorted (Tarjan's strongly connected components, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules it imports, from ``module -> (source, is_package)``."""
    return {module: {t for t, _ in modules_imported(module, src, is_pkg)} for module, (src, is_pkg) in sources.items()}


def our_sources() -> dict[str, tuple[str, bool]]:
    return {module: (path.read_text(), path.name == "__init__.py") for module, path in modules()}


def test_every_import_goes_down() -> None:
    found = [v for module, path in modules() for v in violations(module, path.read_text(), path.name == "__init__.py")]
    assert not found, "\n".join(found)


def test_every_package_has_a_layer() -> None:
    for module, _ in modules():
        if module not in PACKAGES:
            rank(module)


def test_every_import_inside_a_package_goes_down_its_floors() -> None:
    found = [v for module, (src, is_pkg) in our_sources().items() for v in floor_violations(module, src, is_pkg)]
    assert not found, "\n".join(found)


def test_every_module_of_a_package_with_floors_is_on_one() -> None:
    for module, _ in modules():
        for package in FLOORS:
            if module.startswith(package + "."):
                floor(package, module)


def test_no_import_goes_round_in_a_circle() -> None:
    assert circles(import_graph(our_sources())) == []


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


def test_the_check_sees_imports_up_a_packages_floors() -> None:
    """The storage core's old arrows back up are caught; the ones down are not."""
    typed = "if TYPE_CHECKING:\n    from gym_services.control.store import CheckpointStore"
    assert floor_violations("gym_services.control.records", typed) == []
    assert floor_violations("gym_services.control.manifests", typed)  # the store stands on the manifests
    assert floor_violations("gym_services.control.store", "from gym_services.control.packs import sha256_hex")
    assert floor_violations("gym_services.control.storage.base", "from gym_services.control.storage.file import F")
    assert floor_violations("gym_services.control.storage.file", "from gym_services.control.storage import Storage")
    assert floor_violations("gym_services.control.layout", "from . import models")
    assert floor_violations("gym_services.models.policy_model.generations", "from .participant import Model")
    assert not floor_violations("gym_services.control.storage", "from gym_services.control.storage.base import E")
    assert not floor_violations("gym_services.control.store", "from gym_services.control import layout")
    assert not floor_violations("gym_services.control.packs", "from gym_services.control.storage import Storage")
    assert not floor_violations("gym_services.models.policy_model.ledger.routes", "from ..generations import G")


def test_the_check_sees_a_circle() -> None:
    """A synthetic circle, fed as sources, is reported whole; one arrow less and it is gone."""
    sources = {
        "gym_services.control.store": ("from gym_services.control.packs import sha256_hex", False),
        "gym_services.control.packs": ("from gym_services.control.records import read", False),
        "gym_services.control.records": ("from gym_services.control.store import CheckpointStore", False),
        "gym_services.control.layout": ("", False),
    }
    circle = ["gym_services.control.packs", "gym_services.control.records", "gym_services.control.store"]
    assert circles(import_graph(sources)) == [circle]
    assert circles(import_graph(sources | {"gym_services.control.records": ("", False)})) == []
    assert circles({"a": {"b"}, "b": {"c", "a"}, "c": {"c"}, "d": {"e"}, "e": {"d"}}) == [["a", "b"], ["d", "e"]]
