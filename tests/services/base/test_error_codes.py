"""Error codes are one vocabulary: each has one HTTP status, and a code that is not one fails at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gym_services.base.errors import ApiError, ErrorCode

SOURCES = Path(__file__).resolve().parents[3] / "services"


def test_every_code_has_its_status() -> None:
    assert ApiError(ErrorCode.STALE_ATTEMPT, "x").status == 409
    assert ApiError(ErrorCode.STORAGE_UNAVAILABLE, "x").response().status_code == 502
    assert ApiError("not_ready", "x").body() == {"error": {"code": "not_ready", "message": "x"}}
    assert all(400 <= code.status < 600 for code in ErrorCode)


def test_a_typo_is_an_error_not_a_400() -> None:
    with pytest.raises(ValueError):
        ApiError("stale_atempt", "x")


#: the one place a bare HTTP status becomes an error (Starlette's own 404 and 405)
TRANSLATES_STATUS = Path("gym_services/server/app.py")


def test_codes_are_members_and_carry_their_own_status() -> None:
    """Codes are written as ErrorCode members (a typo cannot hide on a path no test takes), and no call
    overrides the code's status (a code means one status)."""
    found = []
    for path in SOURCES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ApiError":
                where = f"{path.relative_to(SOURCES)}:{node.lineno}"
                if node.args and isinstance(node.args[0], ast.Constant):
                    found.append(f"{where} code spelled {node.args[0].value!r}")
                if any(k.arg == "status" for k in node.keywords) and path.relative_to(SOURCES) != TRANSLATES_STATUS:
                    found.append(f"{where} overrides the status")
    assert not found, found
