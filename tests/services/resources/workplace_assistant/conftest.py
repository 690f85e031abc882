"""Fixtures for the Workplace Assistant domain tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_services.resources.workplace_assistant.environment import DATA_DIR, WorkplaceEnvironment


@pytest.fixture
def env() -> WorkplaceEnvironment:
    return WorkplaceEnvironment.fresh()


def load_examples() -> list[dict[str, Any]]:
    path: Path = DATA_DIR / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
