"""Where a server comes from: shipped, registered by an installed package (entry point), or an import path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.server import sources
from gym_services.server.sources import ENTRY_POINT_GROUP, Origin, UnknownServer


@pytest.fixture
def installed_package(tmp_path, monkeypatch):
    """A distribution on sys.path registering servers (one good, one with a shipped server's name, one dotted)."""
    (tmp_path / "third_party_env.py").write_text(
        textwrap.dedent(
            """
            from gym_services.resources.counter.app import Config, create_app as _counter

            def create_app(config: Config):
                return _counter(config)
            """
        )
    )
    (tmp_path / "plain_env.py").write_text("def create_app(config):\n    return None\n")
    info = tmp_path / "third_party-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: third-party\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        "third_env = third_party_env:create_app\n"
        "counter = third_party_env:create_app\n"
        "bad.name = third_party_env:create_app\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_shipped_names_entry_points_and_import_paths(installed_package) -> None:
    found, skipped = sources.installed()
    by_name = {s.name: s for s in found}
    assert by_name["counter"].origin is Origin.BUILT_IN
    assert by_name["third_env"].describe() == "entry point of third-party 1.2"
    assert {s.name: s.reason for s in skipped} == {
        "bad.name": f"the name must match {sources.NAME_PATTERN.pattern} (no dots or colons)",
        "counter": "a server shipped with gym-checkpoint has this name",
    }
    assert sources.load("third_env").config_class is CounterConfig
    by_path = sources.load("third_party_env:create_app")
    assert by_path.source.origin is Origin.IMPORT_PATH and by_path.source.default_name == "third_party_env"
    assert sources.load("gym_services.resources.counter.app").config_class is CounterConfig


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown server 'nope'"),
        ("counter.app:", "is not an import path"),
        ("no_such_module:create_app", "cannot import no_such_module"),
        ("third_party_env:missing", "has no callable missing"),
        ("plain_env:create_app", "takes no ServerConfig"),
    ],
)
def test_what_does_not_lead_to_a_server_is_named(installed_package, spec, message) -> None:
    with pytest.raises(UnknownServer, match=message):
        sources.load(spec)


def test_check_finds_an_import_path_without_importing_it(installed_package) -> None:
    assert sources.check("third_party_env:create_app").module == "third_party_env"
    with pytest.raises(UnknownServer, match="no module nowhere_here"):
        sources.check("nowhere_here:create_app")


def test_gymckpt_servers_lists_them(installed_package) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed_package), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", "servers", "--json", "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    third = next(s for s in listed["servers"] if s["name"] == "third_env")
    assert third == {
        "name": "third_env",
        "origin": "entry point",
        "distribution": "third-party 1.2",
        "target": "third_party_env:create_app",
        "error": None,
    }
    assert sorted(s["name"] for s in listed["skipped"]) == ["bad.name", "counter"]
