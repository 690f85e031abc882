"""The operator docs stay true: the chart README's values table is values.schema.json + values.yaml, every
value is documented, docs/operations/servers.md is every server's Config, and relative links resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("generate_docs", ROOT / "docs" / "operations" / "generate.py")
generate = importlib.util.module_from_spec(spec)
assert spec.loader is not None
spec.loader.exec_module(generate)

REGENERATE = "out of date: run .venv/bin/python docs/operations/generate.py"


def test_the_chart_readme_values_table_is_generated_from_the_schema() -> None:
    current = generate.CHART_README.read_text()
    assert current == generate.chart_readme(current), REGENERATE


def test_every_value_is_in_the_table_with_a_description() -> None:
    import json

    schema = json.loads((generate.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((generate.CHART / "values.yaml").read_text())
    rows = {
        key: (kind, default, description) for key, kind, default, description in generate.values_rows(schema, values)
    }
    assert all(description for _, _, description in rows.values()), [k for k, v in rows.items() if not v[2]]

    def leaves(value: Any, prefix: str = "") -> list[str]:
        if isinstance(value, dict) and value and prefix not in rows:
            return [
                leaf for key, child in value.items() for leaf in leaves(child, f"{prefix}.{key}" if prefix else key)
            ]
        return [prefix]

    for leaf in leaves(values):
        assert leaf in rows, f"{leaf} is in values.yaml but not documented"


def test_each_servers_configuration_fields_are_documented() -> None:
    assert generate.SERVERS_DOC.read_text() == generate.servers_doc(), REGENERATE
    from gym_services.server.registry import SERVERS

    text = generate.SERVERS_DOC.read_text()
    for server in SERVERS:
        assert f"## `{server}`" in text


@pytest.mark.parametrize(
    "doc",
    sorted(
        str(p.relative_to(ROOT))
        for p in [
            *(ROOT / "docs" / "operations").glob("*.md"),
            ROOT / "charts" / "gym-checkpoint" / "README.md",
            ROOT / "README.md",
        ]
    ),
)
def test_relative_links_resolve(doc: str) -> None:
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{doc} links to {target}, which does not exist"
