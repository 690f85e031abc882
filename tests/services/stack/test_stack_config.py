"""Stack configs: loading, URL references, and the shipped example matching the demo stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_services.base.config import ConfigError
from gym_services.demo.stack import demo_stack
from gym_services.stack.config import load_stack, substitute_urls

ROOT = Path(__file__).resolve().parents[3]


def test_example_stack_is_the_demo_stack() -> None:
    stack, _ = load_stack(ROOT / "examples" / "stack.yaml")
    demo = demo_stack(Path(".gymckpt/stack"))
    assert {k: (v.server, v.participant, v.config) for k, v in stack.servers.items()} == {
        k: (v.server, v.participant, v.config) for k, v in demo.servers.items()
    }


def test_references_are_substituted() -> None:
    urls = {"x": "http://127.0.0.1:9000"}
    assert substitute_urls({"a": "{url:x}/v1", "p": "{port:x}", "h": "{host:x}", "l": ["{url:x}"]}, urls) == {
        "a": "http://127.0.0.1:9000/v1", "p": 9000, "h": "127.0.0.1", "l": ["http://127.0.0.1:9000"]
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: s\nservers: {a: {server: nope}}\n", "unknown servers"),
        ("name: s\nservers: {a: {server: counter, config: {u: '{url:b}'}}}\n", "not in the stack"),
        ("name: s\nservers: {a: {server: counter, bogus: 1}}\n", "bogus"),
        ("[1, 2", "cannot read"),
    ],
)
def test_bad_stack_configs_are_refused(tmp_path, text, message) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_stack(path)
