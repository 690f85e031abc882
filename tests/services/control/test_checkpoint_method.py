"""The checkpoint methods are ``background`` and ``sync``; ``snapshot``, the old name of ``background``, is still
read on every input a user or stored data may give it (``docs/decisions.md``, "The checkpoint methods are
`background` and `sync`"): the enum, the stored global manifest, the transaction's result, ``gymckpt checkpoint
--method``, a Checkpoint's spec as the operator parses it, and the Checkpoint CRD's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gym_services.cli import build_parser
from gym_services.control.manifests import parse_global_manifest
from gym_services.control.protocol import DEPRECATED_BACKGROUND, CheckpointMethod
from gym_services.coordination.transaction import TransactionResult

ROOT = Path(__file__).resolve().parents[3]
STORED = ROOT / "tests/fixtures/v1_checkpoint/store/checkpoints/v1-ck/manifest.json"


def test_the_methods_and_the_alias() -> None:
    assert [m.value for m in CheckpointMethod] == ["background", "sync"]
    assert CheckpointMethod(DEPRECATED_BACKGROUND) is CheckpointMethod.BACKGROUND == CheckpointMethod("background")
    with pytest.raises(ValueError):
        CheckpointMethod("later")


@pytest.mark.parametrize(
    ("stored", "read"), [("snapshot", "background"), ("background", "background"), ("sync", "sync")]
)
def test_a_stored_global_manifest_says_its_method_either_way(stored: str, read: str) -> None:
    document = json.loads(STORED.read_bytes())
    document["method"] = stored
    assert parse_global_manifest(json.dumps(document).encode()).method is CheckpointMethod(read)


def test_a_result_on_the_wire_reads_the_old_name() -> None:
    sent = {
        "kind": "checkpoint",
        "status": "completed",
        "phase": "Completed",
        "checkpoint_id": "ck",
        "location": "s3://b",
    }
    result = TransactionResult.model_validate_json(json.dumps({**sent, "method": "snapshot"}))
    assert result.method is CheckpointMethod.BACKGROUND
    assert json.loads(result.model_dump_json())["method"] == "background"  # what is written says the new name


@pytest.mark.parametrize(("given", "method"), [([], "background"), (["--method", "snapshot"], "background")])
def test_gymckpt_checkpoint_takes_the_old_name(given: list[str], method: str) -> None:
    args = build_parser().parse_args(["checkpoint", *given])
    assert CheckpointMethod(args.method) is CheckpointMethod(method)


def test_a_checkpoint_spec_with_the_old_name_is_a_background_checkpoint() -> None:
    specs = pytest.importorskip("gym_operator.specs")  # the operator extra
    spec = specs.CheckpointSpec.parse({"release": "rl", "method": "snapshot"})
    assert spec.method is CheckpointMethod.BACKGROUND
    assert specs.CheckpointSpec.parse({"release": "rl"}).method is CheckpointMethod.BACKGROUND


def method_schema(where: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "charts/gym-checkpoint/crds/checkpoints.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][where]["properties"]["method"]


@pytest.mark.parametrize("where", ["spec", "status"])
def test_the_crd_accepts_both_names_and_nothing_else(where: str) -> None:
    for value in ("background", "sync", "snapshot"):
        jsonschema.validate(value, method_schema(where))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("later", method_schema(where))
    assert set(method_schema(where)["enum"]) == {*(m.value for m in CheckpointMethod), DEPRECATED_BACKGROUND}
