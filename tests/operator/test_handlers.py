"""kopf's registration stays in one place: every handler the operator registers is defined in
``gym_operator.handlers`` (the controllers register nothing), for the resources and causes the module lists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import kopf

CONTROLLERS = Path(__file__).resolve().parents[2] / "operator" / "gym_operator" / "controllers"


def test_every_handler_is_registered_in_handlers_py() -> None:
    handlers = importlib.import_module("gym_operator.handlers")
    registry = kopf.get_default_registry()
    # kopf keeps one registry per kind of handler, with no public accessor (kopf is pinned: docker/requirements.lock)
    kinds = ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks")
    ours = {
        handler.id: handler.fn
        for kind in kinds
        for handler in getattr(registry, kind).get_all_handlers()
        if handler.fn.__module__.startswith("gym_operator")
    }
    assert {fn.__module__ for fn in ours.values()} == {"gym_operator.handlers"}
    assert set(ours) == {
        "login",
        "startup",
        "checkpoint_daemon",
        "checkpoint_seen",
        "checkpoint_deleted",
        "restore_daemon",
        "restore_seen",
        "schedule_seen",
        "pod_event",
        "release_when_going_away",
    }
    for name in ours:  # each is named in the module's own list
        assert f":func:`{name}`" in (handlers.__doc__ or ""), name


def test_no_controller_registers_with_kopf() -> None:
    for path in sorted(CONTROLLERS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                chain = f"{getattr(node.value.value, 'id', '')}.{node.value.attr}"
                assert chain != "kopf.on", f"{path.name} registers a kopf handler: register it in handlers.py"
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "kopf":
                assert node.attr not in ("daemon", "timer", "index"), f"{path.name} uses kopf.{node.attr}"
