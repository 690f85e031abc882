"""Checkpoint and Restore specs are parsed once, with every default filled in one place."""

from __future__ import annotations

import pytest

from gym_operator.specs import (
    AccessMode,
    CheckpointSpec,
    LocationSpec,
    OperatorSettings,
    RestoreSpec,
    SpecError,
    StorageLocation,
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


def test_storage_locations_are_resources() -> None:
    """A CheckpointStorageLocation's spec gives its URL; `GYMCKPT_STORAGE` is only the operator's own default (run
    without the chart); the retired `GYMCKPT_STORAGE_LOCATIONS` is refused, naming what replaced it."""
    spec = LocationSpec.parse(
        {"release": "gym", "bucket": "b", "prefix": "/team/a/", "credential": {"name": "k"}, "accessMode": "ReadOnly"}
    )
    assert spec.url == "s3://b/team/a" and spec.credential is not None and spec.credential.name == "k"
    assert spec.access_mode is AccessMode.READ_ONLY and spec.validation_frequency.total_seconds() == 60
    assert LocationSpec.parse({"release": "gym", "provider": "file", "prefix": "/mnt/ckpt"}).url == "file:///mnt/ckpt"
    assert LocationSpec.parse({"release": "gym", "bucket": "b", "validationFrequency": "0s"}).url == "s3://b"
    for bad in ({"release": "gym"}, {"release": "gym", "provider": "file", "prefix": "relative"}):
        with pytest.raises(SpecError):
            LocationSpec.parse(bad)
    resource = {"metadata": {"name": "archive"}, "spec": {"release": "gym", "bucket": "a"}, "status": {}}
    assert StorageLocation.of(resource) == StorageLocation(name="archive", url="s3://a", resource="archive")
    down = {**resource, "status": {"phase": "Unavailable", "message": "no such bucket"}}
    assert StorageLocation.of(down).unavailable == "no such bucket"
    base = {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": "gym"}
    assert OperatorSettings.from_env({**base, "GYMCKPT_STORAGE": "s3://b/p"}).default_location == "s3://b/p"
    with pytest.raises(SpecError, match="CheckpointStorageLocation resources"):
        OperatorSettings.from_env({**base, "GYMCKPT_STORAGE_LOCATIONS": '{"a": {"url": "s3://x/y"}}'})
    with pytest.raises(SpecError, match="GYMCKPT_GATEWAY_KEY"):
        OperatorSettings.from_env({**base, "GYMCKPT_GATEWAY_KEY": "short"})


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
    assert (settings.default_location, settings.release, settings.scanning_disabled, settings.region) == (
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
