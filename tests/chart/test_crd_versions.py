"""The CRDs' `gym-checkpoint.dev/schema-version` annotation is what `helm upgrade` compares with the installed
CRDs (templates/validate.yaml): it must change whenever a CRD's spec changes, or an upgrade would run over stale
CRDs unnoticed. Each version is recorded here with the digest of the specs it stands for."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
# schema-version -> digest of each CRD's spec; a new version adds a line, old ones stay
VERSIONS = {
    "1": {"checkpoints": "794fa65e811a6dff", "restores": "81846e1cce1ab85e"},
    "2": {"checkpoints": "a55adbe49fad072d", "restores": "24d9994d6e2a5b30"},
    "3": {"checkpoints": "a3aefb400cd87c2b", "restores": "cf854bc450cad902"},
    "4": {"checkpoints": "36dac06bdab1f072", "restores": "8ad86d3f9efc8d59"},
    "5": {"checkpoints": "4c35cf22e4868a41", "restores": "73017a7188ac77e1"},
    "6": {"checkpoints": "538db49676686ccf", "restores": "7b8cd5b940cd5655"},
    # the checkpoint method background (snapshot kept as its deprecated alias); timings described by their steps
    "7": {"checkpoints": "4239691bc9bb1528", "restores": "d9af3be7bdc5fdff"},
    # CheckpointSchedule; Checkpoint spec.final, spec.deadline and status.final (termination checkpoints)
    "8": {"checkpoints": "3dc5d69be026a78a", "checkpointschedules": "c87ae1a1b907f141", "restores": "d9af3be7bdc5fdff"},
    # every field described, selector keys and values validated (the schedule's template too);
    # CheckpointStorageLocation (storageLocation names one)
    "9": {
        "checkpoints": "979a81e39d413f14",
        "checkpointschedules": "e357bd943142458a",
        "restores": "36033613803d99b4",
        "storagelocations": "572d08f853af0a9f",
    },
}


def digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def test_a_changed_crd_spec_comes_with_a_new_schema_version() -> None:
    crds = {path.stem: yaml.safe_load(path.read_text()) for path in sorted(CRDS.glob("*.yaml"))}
    versions = {crd["metadata"]["annotations"]["gym-checkpoint.dev/schema-version"] for crd in crds.values()}
    assert len(versions) == 1, f"every CRD carries the same schema-version, not {versions}"
    (version,) = versions
    current = {name: digest(crd["spec"]) for name, crd in crds.items()}
    assert version in VERSIONS, (
        f"schema-version {version} is not recorded: add {version!r}: {current} to VERSIONS in {Path(__file__).name}"
    )
    assert VERSIONS[version] == current, (
        f"a CRD spec changed under schema-version {version}: bump gym-checkpoint.dev/schema-version in every CRD "
        f"and record the new version with {current} in {Path(__file__).name}"
    )
