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
        "a": "http://127.0.0.1:9000/v1",
        "p": 9000,
        "h": "127.0.0.1",
        "l": ["http://127.0.0.1:9000"],
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: s\nservers: {a: {server: nope}}\n", "unknown server"),
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


def test_a_replicated_server_is_the_list_of_its_replicas() -> None:
    urls = {"w": ["http://127.0.0.1:9001", "http://127.0.0.1:9002"], "m": "http://127.0.0.1:9000"}
    assert substitute_urls({"base": "{url:w}/v1", "model": "{url:m}", "both": "{url:m}/{url:w}"}, urls) == {
        "base": ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"],
        "model": "http://127.0.0.1:9000",
        "both": ["http://127.0.0.1:9000/http://127.0.0.1:9001", "http://127.0.0.1:9000/http://127.0.0.1:9002"],
    }


def test_replicas_in_the_stack_yaml(tmp_path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(
        "name: s\nservers:\n"
        "  w: {server: inference_worker, participant: false, replicas: 3}\n"
        "  m: {server: policy_model, replicas: 2, config: {upstream: {base_url: '{url:w}/v1'}}}\n"
    )
    stack, _ = load_stack(path)
    assert stack.servers["w"].instances("w") == ["w-0", "w-1", "w-2"]
    assert stack.servers["m"].instances("m") == ["m-0", "m-1"]


@pytest.mark.parametrize(
    "servers, message",
    [
        ("c: {server: collection, replicas: 2}", "cannot have replicas"),
        ("a: {server: counter, replicas: 2, port: 9000}", "port must be 0"),
        ("a: {server: counter, replicas: 2}\n  b: {server: counter, config: {h: '{host:a}'}}", "only {url:a}"),
        ("a: {server: counter, replicas: 2}\n  a-1: {server: counter}", "taken twice"),
        (
            "a: {server: counter, replicas: 2}\n  b: {server: counter, replicas: 2}\n  c: "
            "{server: counter, config: {u: '{url:a}{url:b}'}}",
            "two replicated servers",
        ),
        ("a: {server: counter, replicas: 0}", "replicas"),
    ],
)
def test_bad_replicas_are_refused(tmp_path, servers, message) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(f"name: s\nservers:\n  {servers}\n")
    with pytest.raises(ConfigError, match=message):
        load_stack(path)
