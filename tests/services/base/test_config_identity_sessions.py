"""Unit tests of the shared server base: config loading, rollout identity, signed session cookies."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from pydantic import Field

from gym_services.base.config import ConfigError, ServerConfig, load_config
from gym_services.base.errors import ApiError
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import SessionCodec


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """Set exactly these GYMCKPT variables (every other one removed) for the test."""

    def set_env(env: dict[str, str]) -> None:
        for name in list(os.environ):
            if name.upper().startswith("GYMCKPT_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    set_env({})
    return set_env


def test_config_layers_file_env_overrides(tmp_path, environ) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: srv\nport: 1234\ncheckpoint: {lease_check_interval_s: 1.0}\n")
    environ(
        {
            "GYMCKPT_CONTROL_TOKEN": "tok",
            "GYMCKPT_SESSION_SECRET": "0123456789abcdef!",
            "GYMCKPT_PARTICIPANT_ID": "srv-0",
            "GYMCKPT__STORAGE__MAX_CONCURRENCY": "4",
            "GYMCKPT__PORT": "4321",
        }
    )
    cfg = load_config(ServerConfig, path, {"port": 9999})
    assert (cfg.name, cfg.port, cfg.participant_id, cfg.storage.max_concurrency) == ("srv", 9999, "srv-0", 4)
    assert cfg.checkpoint.control_token is not None and cfg.checkpoint.control_token.get_secret_value() == "tok"
    assert cfg.checkpoint.lease_check_interval_s == 1.0
    cfg.require_secrets()
    assert load_config(ServerConfig, path).port == 4321  # the environment wins over the file


class ListConfig(ServerConfig):
    hosts: list[str] = Field(default_factory=list)
    limits: dict[str, int] = Field(default_factory=dict)


def test_environment_values_and_precedence(tmp_path, environ) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: srv\nstorage: {endpoint_url: http://127.0.0.1:1}\ncheckpoint: {participant_id: file}\n")
    environ(
        {
            "GYMCKPT__HOSTS": "[a, 'b']",  # a list written as YAML
            "GYMCKPT__LIMITS": "{x: 1}",
            "GYMCKPT__LIMITS__Y": "2",
            "GYMCKPT__STORAGE__ENDPOINT_URL": "null",  # none, over the file's
            "GYMCKPT_PARTICIPANT_ID": "shortcut",
            "GYMCKPT__CHECKPOINT__PARTICIPANT_ID": "nested",  # wins over the shortcut
            "GYMCKPT_SESSION_SECRET": "",  # empty: not set
            "GYMCKPT_JOB_TOKEN": "job",  # a shortcut for a field ListConfig does not have: left out
        }
    )
    cfg = load_config(ListConfig, path)
    assert cfg.hosts == ["a", "b"] and cfg.limits == {"x": 1, "y": 2}
    assert cfg.storage.endpoint_url is None
    assert cfg.participant_id == "nested"
    assert cfg.session_secret is None


@pytest.mark.parametrize(
    "text, env, message",
    [
        ("name: srv\nbogus: 1\n", {}, "bogus"),
        ("name: srv\nport: -1\n", {}, "port"),
        ("- a list\n", {}, "must be a mapping"),
        ("name: srv\n", {"GYMCKPT__PORT": "not-a-port"}, "port"),
        ("name: srv\n", {"GYMCKPT__PROT": "1"}, "GYMCKPT__PROT: no such field in ServerConfig"),
        ("name: srv\n", {"GYMCKPT__STORAGE__BOGUS": "1"}, "storage.bogus"),
    ],
)
def test_bad_configs_say_which_field(tmp_path, environ, text, env, message) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    environ(env)
    with pytest.raises(ConfigError, match=message):
        load_config(ServerConfig, path)


def test_missing_secrets_refuse_to_start(environ) -> None:
    cfg = load_config(ServerConfig, overrides={"name": "srv"})
    with pytest.raises(ConfigError, match=r"control_token.*session_secret"):
        cfg.require_secrets()
    load_config(ServerConfig, overrides={"name": "srv", "checkpoint": {"enabled": False}}).require_secrets()


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"_ng_rollout_id": "abc.1"}, ("abc.1", 0)),
        ({"_ng_rollout_id": "abc", "_ng_attempt_index": 2}, ("abc", 2)),
        ({"_ng_task_index": 3, "_ng_rollout_index": 1}, ("3-1", 0)),
        ({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": None}, ("3-1", 0)),
        ({"_ng_rollout_id": "x", "_ng_task_index": 3, "_ng_rollout_index": 1}, ("x", 0)),
    ],
)
def test_identity_from_run_body(body, expected) -> None:
    ident = RolloutIdentity.from_run_body(body)
    assert (ident.rollout_id, ident.attempt) == expected
    assert RolloutIdentity.from_headers(ident.headers()) == ident


@pytest.mark.parametrize(
    "body, code",
    [
        ({}, "rollout_id_required"),
        ({"_ng_task_index": 1}, "rollout_id_required"),
        ({"_ng_rollout_id": "../etc"}, "bad_request"),
        ({"_ng_rollout_id": "ok", "_ng_attempt_index": -1}, "bad_request"),
        ({"_ng_rollout_id": "ok", "_ng_attempt_index": True}, "bad_request"),
        ({"_ng_task_index": "1", "_ng_rollout_index": 0}, "bad_request"),
    ],
)
def test_bad_identities_are_refused(body, code) -> None:
    with pytest.raises(ApiError) as err:
        RolloutIdentity.require_from_run_body(body)
    assert err.value.code == code


def test_identity_headers_and_stamp() -> None:
    with pytest.raises(ApiError):
        RolloutIdentity.from_headers({"x-ng-rollout-id": "r", "x-ng-attempt": "one"})
    assert RolloutIdentity.from_headers({}) is None
    ident = RolloutIdentity(rollout_id="r", attempt=1)
    assert ident.next_attempt().attempt == 2
    assert ident.stamp({"a": 1}) == {"a": 1, "_ng_rollout_id": "r", "_ng_attempt_index": 1}


def test_session_cookies_survive_a_fresh_process_but_not_a_forgery() -> None:
    original = SessionCodec("a-deployment-secret-123", "workplace")
    fresh = SessionCodec("a-deployment-secret-123", "workplace")
    signed = original.sign("sid-1")
    assert fresh.read(signed) == "sid-1"
    assert SessionCodec("another-secret-xyz-123", "workplace").read(signed) is None
    assert SessionCodec("a-deployment-secret-123", "blackjack").read(signed) is None  # per-server salt
    assert fresh.read(signed[:-2] + "xx") is None
    assert original.name == "gym_session_workplace"
