"""kemu's test harness (kemu/harness.py): the audit of every request, injected faults with kube-apiserver's
answers, and outages. The operator's fault tests (tests/operator) stand on these, so each is checked here."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.k8s

GROUP = "gym-checkpoint.dev"


def test_audit_records_each_request_with_its_identity_and_answer(kemu: Any, kubectl: Any) -> None:
    kubectl("create", "configmap", "audited", "--from-literal=a=b")
    kubectl("create", "serviceaccount", "reader")
    token = kubectl("create", "token", "reader").stdout.strip()
    with kemu.client(token=token) as reader:
        assert reader.get("/api/v1/namespaces/default/configmaps/audited").status_code == 403
    mine = kemu.audit(user="system:serviceaccount:default:reader")
    assert [(e["verb"], e["resource"], e["name"], e["code"]) for e in mine] == [("get", "configmaps", "audited", 403)]
    admin = kemu.audit(user="kemu-admin")
    assert ("create", "configmaps", "", 201) in [(e["verb"], e["resource"], e["name"], e["code"]) for e in admin]
    with kemu.client(token=token) as reader:  # the harness is the admin's only
        assert reader.get("/kemu/v1/audit").status_code == 403


def test_a_watch_is_audited_while_it_streams(kemu: Any) -> None:
    """A watch is in the audit from its start (code 0 until it ends): a test reading the audit mid-run sees it."""
    with (
        kemu.client() as api,
        api.stream(
            "GET", "/api/v1/namespaces/default/configmaps", params={"watch": "true", "timeoutSeconds": "30"}
        ) as watch,
    ):
        assert watch.status_code == 200
        entry = next(e for e in kemu.audit(user="kemu-admin") if e["verb"] == "watch" and e["resource"] == "configmaps")
        assert entry["code"] in (0, 200)


@pytest.mark.parametrize(
    ("code", "reason"),
    [(409, "Conflict"), (429, "TooManyRequests"), (500, "InternalError"), (503, "ServiceUnavailable")],
)
def test_injected_faults_answer_like_kube_apiserver_then_run_out(
    kemu: Any, kubectl: Any, code: int, reason: str
) -> None:
    kubectl("create", "configmap", "target", "--from-literal=a=b")
    kemu.inject(code, times=2, verb="patch", resource="configmaps", name="target")
    path = "/api/v1/namespaces/default/configmaps/target"
    merge = {"Content-Type": "application/merge-patch+json"}
    with kemu.client() as api:
        assert api.get(path).status_code == 200  # a get is not matched
        for _ in range(2):
            answer = api.patch(path, content='{"data": {"a": "c"}}', headers=merge)
            assert answer.status_code == code
            body = answer.json()
            assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", reason, code)
            if code == 429:
                assert answer.headers["Retry-After"] == "1" and body["details"]["retryAfterSeconds"] == 1
        assert api.get(path).json()["data"] == {"a": "b"}  # a refused write changes nothing
        assert api.patch(path, content='{"data": {"a": "c"}}', headers=merge).status_code == 200
    assert kemu.faults()[0]["served"] == 2
    codes = [e["code"] for e in kemu.audit(user="kemu-admin") if e["verb"] == "patch"]
    assert codes == [code, code, 200]


def _refused(url: str) -> bool:
    host, port = url.removeprefix("https://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def test_an_outage_refuses_connections_then_the_server_comes_back_with_its_objects(kemu: Any, kubectl: Any) -> None:
    kubectl("create", "configmap", "kept", "--from-literal=a=b")
    started = time.monotonic()
    kemu.outage(2.0)
    deadline = time.monotonic() + 5
    while not _refused(kemu.url):  # the listener closes right after answering
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(httpx.TransportError), kemu.client(timeout=2) as api:
        api.get("/api/v1/namespaces/default/configmaps/kept")
    while _refused(kemu.url):
        assert time.monotonic() - started < 10, "kemu did not come back"
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.9
    with kemu.client() as api:
        assert api.get("/api/v1/namespaces/default/configmaps/kept").json()["data"] == {"a": "b"}


def test_a_watch_from_a_compacted_revision_gets_a_streamed_410(kemu: Any) -> None:
    """After etcd compaction the watch cache answers a watch from an older resourceVersion with 200 and one streamed
    `ERROR` event carrying the 410 `Expired` Status (the form kopf and client-go handle: list again, then watch),
    not with an HTTP 410 before streaming."""
    configmaps = "/api/v1/namespaces/default/configmaps"
    with kemu.client() as api:
        old = api.post(configmaps, json={"metadata": {"name": "before"}}).json()["metadata"]["resourceVersion"]
        api.post(configmaps, json={"metadata": {"name": "after"}})
        compacted = kemu.compact()
        with api.stream(
            "GET", configmaps, params={"watch": "true", "resourceVersion": old, "timeoutSeconds": "10"}
        ) as stream:
            assert stream.status_code == 200
            lines = list(stream.iter_lines())
        assert len(lines) == 1
        event = json.loads(lines[0])
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
        assert event["object"]["message"].startswith(f"too old resource version: {old} (")
        # from the compacted revision on, a watch resumes as before
        api.post(configmaps, json={"metadata": {"name": "later"}})
        with api.stream(
            "GET", configmaps, params={"watch": "true", "resourceVersion": compacted, "timeoutSeconds": "1"}
        ) as stream:
            names = [json.loads(line)["object"]["metadata"]["name"] for line in stream.iter_lines()]
        assert names == ["later"]


def test_a_stalled_watch_delivers_nothing_while_a_new_one_works(kemu: Any) -> None:
    """`stall_watches` makes the streams open now silent (a half-open connection: no event, no end), then drops
    them; a watch opened afterwards is served. A client's read timeout is what gets it out (kopf's client_timeout)."""
    configmaps = "/api/v1/namespaces/default/configmaps"
    with kemu.client(timeout=httpx.Timeout(10, read=30)) as api:
        start = api.get(configmaps).json()["metadata"]["resourceVersion"]
        with api.stream(
            "GET", configmaps, params={"watch": "true", "resourceVersion": start, "timeoutSeconds": "60"}
        ) as stalled:
            assert stalled.status_code == 200
            kemu.stall_watches(3.0, resource="configmaps", user="kemu-admin")
            api.post(configmaps, json={"metadata": {"name": "unseen"}})
            with api.stream(
                "GET", configmaps, params={"watch": "true", "resourceVersion": start, "timeoutSeconds": "1"}
            ) as fresh:
                assert [json.loads(line)["object"]["metadata"]["name"] for line in fresh.iter_lines()] == ["unseen"]
            received: list[str] = []
            with pytest.raises(httpx.TransportError):  # dropped: no clean end of the stream
                for line in stalled.iter_lines():
                    received.append(line)
            assert received == []
