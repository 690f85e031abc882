"""Checkpoint and Restore specs are parsed once, with every default filled in one place."""

from __future__ import annotations

import json

import pytest

from gym_operator.specs import (
    CheckpointSpec,
    OperatorSettings,
    RestoreSpec,
    SpecError,
    StorageLocation,
    UnknownLocation,
)
from gym_services.control.protocol import DEFAULT_LEASE_S, DEFAULT_PREPARE_TIMEOUT_S


def test_checkpoint_defaults_come_from_the_protocol() -> None:
    spec = CheckpointSpec.parse({"release": "r"})
    assert spec.lease_seconds == DEFAULT_LEASE_S and spec.prepare_timeout_seconds == DEFAULT_PREPARE_TIMEOUT_S
    assert spec.selector.match_labels == {} and spec.storage_location == "default"


def test_checkpoint_fields_are_read_by_their_crd_names() -> None:
    spec = CheckpointSpec.parse(
        {
            "release": "r",
            "prepareTimeoutSeconds": 60,
            "leaseSeconds": 45,
            "selector": {"matchLabels": {"app": "gym"}},
            "storageLocation": "archive",
        }
    )
    assert (spec.prepare_timeout_seconds, spec.lease_seconds) == (60, 45)
    assert spec.selector.match_labels == {"app": "gym"}
    assert spec.storage_location == "archive"


def test_restore_by_location_reads_the_crd_fields() -> None:
    spec = RestoreSpec.parse({"release": "r", "storageLocation": "archive", "checkpointId": "ck-1", "leaseSeconds": 10})
    assert spec.checkpoint_ref is None and (spec.storage_location, spec.checkpoint_id, spec.lease_seconds) == (
        "archive",
        "ck-1",
        10,
    )
    by_ref = RestoreSpec.parse({"release": "r", "checkpointRef": {"name": "ck1"}})
    assert by_ref.checkpoint_ref is not None and by_ref.checkpoint_ref.name == "ck1"
    assert by_ref.lease_seconds == DEFAULT_LEASE_S


def test_storage_locations_are_the_admins() -> None:
    """`default` is GYMCKPT_STORAGE; the others come from GYMCKPT_STORAGE_LOCATIONS (the chart's storage.locations);
    a name not defined is refused with the names that are."""
    settings = OperatorSettings.from_env(
        {
            "GYMCKPT_CONTROL_TOKEN": "t",
            "GYMCKPT_RELEASE": "gym",
            "GYMCKPT_STORAGE": "s3://b/p",
            "GYMCKPT_STORAGE_LOCATIONS": json.dumps(
                {"archive": {"url": "s3://a/x", "endpoint": "https://s3.example", "existingSecret": "k"}}
            ),
        }
    )
    assert settings.location("default") == StorageLocation(name="default", url="s3://b/p")
    assert settings.location("archive") == StorageLocation(
        name="archive", url="s3://a/x", endpoint="https://s3.example", existing_secret="k"
    )
    with pytest.raises(
        UnknownLocation, match=r"'elsewhere' is not one of the release's storage locations \(archive, default\)"
    ):
        settings.location("elsewhere")
    for bad in ('{"default": {"url": "s3://x/y"}}', '{"a": {"url": "s3://x/y", "credentials": "k"}}', "[1]", "{"):
        with pytest.raises(SpecError, match="GYMCKPT_STORAGE_LOCATIONS"):
            OperatorSettings.from_env(
                {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": "g", "GYMCKPT_STORAGE_LOCATIONS": bad}
            )


@pytest.mark.parametrize(
    "spec",
    [
        {"leaseSeconds": "soon"},
        {"prepareTimeoutSeconds": 0},
        {"selector": {"matchLabels": "x"}},
        {"selector": {"matchLabels": {"bad key": "x"}}},
        {"selector": {"matchLabels": {"tier": "two words"}}},
        {"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a/b"]}]}},
    ],
)
def test_a_malformed_spec_names_its_field(spec: dict) -> None:
    with pytest.raises(SpecError, match=r"spec\.(leaseSeconds|prepareTimeoutSeconds|selector)"):
        CheckpointSpec.parse({"release": "r", **spec})
    with pytest.raises(SpecError, match=r"spec\.release"):
        CheckpointSpec.parse({})


def test_operator_settings_from_the_environment() -> None:
    settings = OperatorSettings.from_env(
        {
            "GYMCKPT_CONTROL_TOKEN": "t",
            "GYMCKPT_STORAGE": "s3://b/p",
            "GYMCKPT_RELEASE": "gym",
            "GYMCKPT_KOPF_SCANNING": "disabled",
            "AWS_REGION": "eu-west-1",
        }
    )
    assert (settings.location("default").url, settings.release, settings.scanning_disabled, settings.region) == (
        "s3://b/p",
        "gym",
        True,
        "eu-west-1",
    )
    assert settings.checkpoint_call_timeout(CheckpointSpec.parse({"release": "gym", "prepareTimeoutSeconds": 60})) == 90
    with pytest.raises(SpecError, match="GYMCKPT_CONTROL_TOKEN"):
        OperatorSettings.from_env({})
    with pytest.raises(SpecError, match="GYMCKPT_RELEASE"):
        OperatorSettings.from_env({"GYMCKPT_CONTROL_TOKEN": "t"})


def test_a_stack_selector_always_keeps_to_the_operators_release() -> None:
    from gym_operator.discovery import selector_string

    participant = "gym-checkpoint.dev/participant"
    assert (
        selector_string({}, "a", f"app.kubernetes.io/instance=a,{participant}")
        == f"app.kubernetes.io/instance=a,{participant}"
    )
    assert selector_string({"tier": "x"}, "a") == f"app.kubernetes.io/instance=a,tier=x,{participant}"
    # naming another release's instance label selects nothing (both must hold), never that release's pods
    assert selector_string({"app.kubernetes.io/instance": "b"}, "a").startswith(
        "app.kubernetes.io/instance=a,app.kubernetes.io/instance=b,"
    )
