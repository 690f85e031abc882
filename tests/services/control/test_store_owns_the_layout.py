"""One owner of what is stored: only the CheckpointStore knows where things are under ``checkpoints/``.

Every other module (services, the operator, the benchmarks) reaches stored checkpoints through
``gym_services.control.store``; none imports the key layout, so none can write beside the store.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[3]
OWNER = ROOT / "services" / "gym_services" / "control" / "store.py"


def imports_layout(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
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


def test_only_the_store_imports_the_layout() -> None:
    files = [p for folder in ("services", "operator", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    assert OWNER in files and imports_layout(OWNER)  # the check sees an import when there is one
    assert sorted(str(p.relative_to(ROOT)) for p in files if p != OWNER and imports_layout(p)) == []
