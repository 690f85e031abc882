"""Where a Restore reads from (gym_operator.controllers.restore.source), against the emulator with the operator's
own Kubernetes client: a Checkpoint by name (completed, of the same release, not being deleted, still at the
location it was written to) or a checkpoint id in a storage location (a CheckpointStorageLocation of the release).
Every other case is refused with its reason (the Restore then ends Failed), or waits (a Checkpoint not completed
yet). How a location name resolves (gym_operator.controllers.location.resolve), and what a ReadOnly one allows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.operator.harness import RELEASE, Kubectl, apply, checkpoint_doc, install_crds

from gym_operator.controllers import catalog
from gym_operator.controllers.context import Context, Refused, Wait, claimed_by
from gym_operator.controllers.location import resolve, usable
from gym_operator.controllers.restore import decision_location, source
from gym_operator.kube import Kube
from gym_operator.specs import OperatorSettings, RestoreSpec
from gym_services.base.config import StorageConfig
from gym_services.control.models import SCHEMA_VERSION, GlobalManifest
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore

pytestmark = pytest.mark.k8s
#: locations nothing is written to (a Restore by id reads the claim there: a folder that does not exist holds none)
DEFAULT_URL = "file:///nonexistent/restore-source/checkpoints"
ELSEWHERE_URL = "file:///nonexistent/restore-source/elsewhere"


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


@pytest.fixture
def restore_source(kemu: Any, kubectl: Kubectl, namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``source(spec)`` as the operator of release RELEASE runs it in the test's namespace (locations ``default``,
    ``elsewhere`` and ``claims``, the last at ``file://<tmp_path>/claims``); the CRDs are installed."""
    install_crds(kemu, kubectl)
    monkeypatch.setenv("KUBECONFIG", str(kemu.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = OperatorSettings.from_env(
        {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": RELEASE, "GYMCKPT_STORAGE": DEFAULT_URL}
    )
    context = Context(settings, Kube.connect())
    location(kubectl, "elsewhere", provider="file", prefix=ELSEWHERE_URL.removeprefix("file://"))
    location(kubectl, "claims", provider="file", prefix=f"{tmp_path}/claims")

    def run(**spec: Any) -> tuple[str, str]:
        checkpoint_id, location = asyncio.run(
            source(RestoreSpec.parse({"release": RELEASE, **spec}), namespace, context)
        )
        return checkpoint_id, location.name

    return run


def location(kubectl: Kubectl, name: str, labels: dict[str, str] | None = None, **spec: Any) -> None:
    doc = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "CheckpointStorageLocation",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"release": RELEASE, **spec},
    }
    kubectl("apply", "-f", "-", input=json.dumps(doc))


def checkpoint(kubectl: Kubectl, name: str, status: dict[str, Any] | None, **spec: Any) -> None:
    """A Checkpoint with the status its operator would have written (no operator runs here)."""
    apply(kubectl, checkpoint_doc(name, **spec))
    if status is not None:
        patch = json.dumps({"status": status})
        kubectl("patch", "checkpoint", name, "--subresource=status", "--type=merge", "-p", patch)


def completed(name: str, location: str = DEFAULT_URL) -> dict[str, Any]:
    return {"phase": "Completed", "reason": "Completed", "checkpointId": f"{name}-0000abcd", "location": location}


def refused(run: Any, **spec: Any) -> Refused:
    with pytest.raises(Refused) as caught:
        run(**spec)
    return caught.value


def test_a_completed_checkpoint_of_the_release_is_read_where_it_was_written(restore_source, kubectl) -> None:
    checkpoint(kubectl, "done", completed("done"))
    checkpoint(kubectl, "moved", completed("moved", ELSEWHERE_URL), storageLocation="elsewhere")
    assert restore_source(checkpointRef={"name": "done"}) == ("done-0000abcd", "default")
    assert restore_source(checkpointRef={"name": "moved"}) == ("moved-0000abcd", "elsewhere")


def test_a_checkpoint_that_cannot_be_restored_is_refused_with_its_reason(restore_source, kubectl) -> None:
    checkpoint(kubectl, "theirs", completed("theirs"), release="another")
    checkpoint(kubectl, "failed", {"phase": "Failed", "reason": "Blocked"})
    checkpoint(kubectl, "relocated", completed("relocated", "s3://bucket/before-the-admin-moved-it"))
    cases = {
        "missing": ("CheckpointNotFound", "does not exist"),
        "theirs": ("CheckpointOfAnotherRelease", "belongs to release another"),
        "failed": ("CheckpointFailed", "failed; nothing to restore"),
        "relocated": ("StorageLocationChanged", f"storage location default is now {DEFAULT_URL}"),
    }
    for name, (reason, message) in cases.items():
        refusal = refused(restore_source, checkpointRef={"name": name})
        assert (refusal.reason, message in refusal.message) == (reason, True), (name, refusal.message)


def test_a_checkpoint_being_deleted_is_refused(restore_source, kubectl) -> None:
    checkpoint(kubectl, "going", completed("going"))
    hold = json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})
    kubectl("patch", "checkpoint", "going", "--type=merge", "-p", hold)
    kubectl("delete", "checkpoint", "going", "--wait=false")
    assert refused(restore_source, checkpointRef={"name": "going"}).reason == "CheckpointDeleted"
    kubectl("patch", "checkpoint", "going", "--type=merge", "-p", json.dumps({"metadata": {"finalizers": None}}))


def test_a_checkpoint_not_completed_yet_is_waited_for(restore_source, kubectl) -> None:
    checkpoint(kubectl, "new", None)
    checkpoint(kubectl, "running", {"phase": "Persisting", "checkpointId": "running-0000abcd"})
    for name in ("new", "running"):
        with pytest.raises(Wait) as waiting:
            restore_source(checkpointRef={"name": name})
        assert waiting.value.reason == "WaitingForCheckpoint" and name in waiting.value.message


def test_a_checkpoint_id_is_read_from_the_storage_location_named(restore_source) -> None:
    assert restore_source(checkpointId="c-1") == ("c-1", "default")
    assert restore_source(checkpointId="c-1", storageLocation="elsewhere") == ("c-1", "elsewhere")
    unknown = refused(restore_source, checkpointId="c-1", storageLocation="nowhere")
    assert unknown.reason == "UnknownStorageLocation" and "kubectl get checkpointstoragelocations" in unknown.message
    assert refused(restore_source).reason == "InvalidSpec"


def test_a_checkpoint_id_of_another_release_is_refused(restore_source, kubectl, tmp_path) -> None:
    """By id as by name, a Restore restores only its own release's checkpoints: two releases sharing a location never
    restore each other's rollouts. The release is the one a Checkpoint resource that recorded the id names, else the
    one the stored claim names (the operator writes `Checkpoint <ns>/<name> (release <release>)`); a checkpoint the
    CLI took (its claim names no release) may be restored into any."""
    store = CheckpointStore(open_storage(f"file://{tmp_path}/claims", StorageConfig()))
    store.claim("ours-1", "tx-1", claimed_by("team", "ours", RELEASE), ["counter-0"])
    store.claim("theirs-1", "tx-2", claimed_by("team", "theirs", "another"), ["counter-0"])
    store.claim("cli-1", "tx-3", "gymckpt checkpoint on host-7", ["counter-0"])
    checkpoint(kubectl, "recorded", completed("recorded"), release="another")  # id recorded-0000abcd
    assert restore_source(checkpointId="ours-1", storageLocation="claims") == ("ours-1", "claims")
    assert restore_source(checkpointId="cli-1", storageLocation="claims") == ("cli-1", "claims")
    for checkpoint_id, location in (("theirs-1", "claims"), ("recorded-0000abcd", "default")):
        refusal = refused(restore_source, checkpointId=checkpoint_id, storageLocation=location)
        assert refusal.reason == "CheckpointOfAnotherRelease" and "taken by release another" in refusal.message


def test_a_location_name_resolves_to_the_releases_resource(kemu, kubectl, namespace, monkeypatch, tmp_path) -> None:
    """By name, else by the chart's label (each release's `default`), else the operator's own default; another
    release's location is never one of this release's; ReadOnly: restored from, never checkpointed to, and a restore
    from it decides at the release's default location. One whose status says Unavailable is checked again before a
    transaction is refused: still failing, refused with both reasons; answering now, used."""
    install_crds(kemu, kubectl)
    monkeypatch.setenv("KUBECONFIG", str(kemu.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    env = {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": RELEASE, "GYMCKPT_STORAGE": DEFAULT_URL}
    context = Context(OperatorSettings.from_env(env), Kube.connect())

    def run(name: str) -> Any:
        return asyncio.run(resolve(name, namespace, context))

    def use(where: Any, write: bool) -> None:
        asyncio.run(usable(where, write, namespace, context))

    assert run("default").url == DEFAULT_URL and run("default").resource is None  # no resource: the operator's own
    location(kubectl, "mine-default", {"gym-checkpoint.dev/location": "default"}, bucket="mine", prefix="p")
    location(kubectl, "theirs-default", {"gym-checkpoint.dev/location": "default"}, bucket="theirs", release="other")
    location(kubectl, "archive", bucket="old", accessMode="ReadOnly", credential={"name": "old-keys"})
    assert (run("default").url, run("default").resource) == ("s3://mine/p", "mine-default")
    assert run("mine-default").url == "s3://mine/p"
    archive = run("archive")
    assert (archive.url, archive.credential, archive.read_only) == ("s3://old", "old-keys", True)
    assert asyncio.run(decision_location(archive, namespace, context)).resource == "mine-default"
    assert asyncio.run(decision_location(run("default"), namespace, context)) is None
    with pytest.raises(Refused) as caught:
        use(archive, write=True)
    assert caught.value.reason == "StorageLocationReadOnly"
    use(archive, write=False)
    with pytest.raises(Refused) as caught:
        run("theirs-default")
    assert caught.value.reason == "UnknownStorageLocation"
    unavailable = {"status": {"phase": "Unavailable", "reason": "StorageUnreachable", "message": "no such bucket"}}
    location(kubectl, "local", provider="file", prefix=str(tmp_path / "store"))
    for name in ("archive", "local"):
        kubectl(
            "patch",
            "checkpointstoragelocation",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(unavailable),
        )
    with pytest.raises(Refused) as caught:
        use(run("archive"), write=False)  # its Secret is missing: still Unavailable
    assert caught.value.reason == "StorageLocationUnavailable"
    assert "no such bucket" in caught.value.message and "checked again now: CredentialsNotFound" in caught.value.message
    assert run("local").unavailable == "no such bucket"
    use(run("local"), write=True)  # the store answers now: used before its next validation


def test_the_catalog_sync_shows_only_the_releases_own_checkpoints(restore_source, kubectl, namespace, tmp_path) -> None:
    """Two releases sharing a location: the catalog sync gives a Checkpoint resource to this release's checkpoints
    and to those the CLI took, never to another release's (such a resource would name this release, and a Restore of
    this release would then restore the other's rollouts, by name or by id)."""
    store = CheckpointStore(open_storage(f"file://{tmp_path}/shared", StorageConfig()))
    for checkpoint_id, taken_by in (
        ("ours-1", claimed_by(namespace, "ours", RELEASE)),
        ("theirs-1", claimed_by(namespace, "theirs", "another")),
        ("cli-1", "gymckpt checkpoint on host-7"),
    ):
        _, publish_by = store.claim(checkpoint_id, f"tx-{checkpoint_id}", taken_by, [])
        manifest = GlobalManifest(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            transaction_id=f"tx-{checkpoint_id}",
            created_at=0,
            participants=[],
        )
        store.publish(manifest, publish_by)
    location(kubectl, "shared", provider="file", prefix=f"{tmp_path}/shared")
    env = {"GYMCKPT_CONTROL_TOKEN": "t", "GYMCKPT_RELEASE": RELEASE, "GYMCKPT_STORAGE": DEFAULT_URL}
    context = Context(OperatorSettings.from_env(env), Kube.connect())
    shared = asyncio.run(resolve("shared", namespace, context))
    resource = json.loads(kubectl("get", "checkpointstoragelocation", "shared", "-o", "json").stdout)
    assert sorted(asyncio.run(catalog.sync(shared, resource, namespace, context))) == ["cli-1", "ours-1"]
    assert restore_source(checkpointRef={"name": "ours-1"}) == ("ours-1", "shared")
    refusal = refused(restore_source, checkpointId="theirs-1", storageLocation="shared")
    assert refusal.reason == "CheckpointOfAnotherRelease" and "taken by release another" in refusal.message
