"""One owner of where things are stored: only ``control/layout.py`` builds or takes apart a key under
``checkpoints/``, and only the storage core uses it.

Every other module (services, the operator, the benchmarks) reaches stored checkpoints through the store's verbs
(``gym_services.control.store``) and retention (``gym_services.control.retention``); none imports the layout, and no
module but the layout spells a part of a key, so none can read or write beside them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[3]
CONTROL = ROOT / "services" / "gym_services" / "control"
LAYOUT = CONTROL / "layout.py"
#: the storage core, the wire models (whose ``PackEntry`` checks a pack's key against the layout's pattern), and the
#: storage gateway's grants (which take a key apart to know whose object it is)
USERS = {CONTROL / name for name in ("store.py", "retention.py", "manifests.py", "models.py", "storage/gateway.py")}
#: a piece of a storage key: the folder, a participant's or a restore's folder, an object's name
KEY_PART = re.compile(
    r"checkpoints/|/participants/|/packs/|/records/|/restores|\.pack\b|(manifest|claim|tombstone|reuses)\.json"
)


def imports_layout(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "gym_services.control"
            and any(alias.name == "layout" for alias in node.names)
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "gym_services.control.layout":
            return True
        if isinstance(node, ast.Import) and any(alias.name == "gym_services.control.layout" for alias in node.names):
            return True
    return False


def key_parts(tree: ast.Module) -> list[str]:
    """String literals (f-string pieces included) that spell a piece of a storage key; docstrings are prose."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and KEY_PART.search(node.value)
    ]


def sources() -> dict[Path, ast.Module]:
    files = [p for folder in ("services", "operator", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    return {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in files}


def test_only_the_storage_core_imports_the_layout() -> None:
    trees = sources()
    assert all(imports_layout(trees[p]) for p in USERS)  # the check sees an import when there is one
    assert (
        sorted(str(p.relative_to(ROOT)) for p, tree in trees.items() if p not in USERS and imports_layout(tree)) == []
    )


def test_only_the_layout_builds_a_key() -> None:
    trees = sources()
    assert key_parts(trees[LAYOUT])  # the check sees the pieces where they are
    assert key_parts(ast.parse('def f(c):\n    """checkpoints/ in prose"""\n    return f"{c}/packs/{1}"'))
    assert not key_parts(ast.parse('"""A docstring naming ``checkpoints/<id>/manifest.json``."""'))
    found = {str(p.relative_to(ROOT)): key_parts(tree) for p, tree in trees.items() if p != LAYOUT}
    assert {path: parts for path, parts in found.items() if parts} == {}
