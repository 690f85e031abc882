"""Fixtures shared by every test folder."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.support.processes import MARK, reap_leaked
from tests.support.seaweed import SeaweedS3, start_seaweed

_bucket_ids = itertools.count()
_test_marks = itertools.count()
_MARK_KEY = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Every process the test function starts carries a mark of this test (see tests/support/processes.py)."""
    tag = item.stash.setdefault(_MARK_KEY, f"{os.getpid()}-{next(_test_marks)}")
    os.environ[MARK] = tag
    try:
        yield
    finally:
        os.environ.pop(MARK, None)


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Torn down after the test's other fixtures: a process the test started and nobody stopped is killed,
    and the test fails naming it (every process a test starts is stopped in a fixture finalizer, pass or fail)."""
    yield
    tag = request.node.stash.get(_MARK_KEY, None)
    leaked = reap_leaked(tag) if tag else {}
    if leaked:
        pytest.fail("processes started by this test were left running (now killed): "
                    + "; ".join(f"{pid}: {cmd[:160]}" for pid, cmd in sorted(leaked.items())), pytrace=False)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One real S3-compatible server (SeaweedFS) for the whole session."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    """Point boto3 at the SeaweedFS server through the standard AWS variables."""
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    return seaweed


@pytest.fixture(scope="session")
def s3_bucket(seaweed: SeaweedS3) -> str:
    """One bucket for the session: each SeaweedFS bucket takes volumes, and `weed mini` has few."""
    return seaweed.create_bucket(f"gymckpt-test-{os.getpid()}")


@pytest.fixture
def s3_location(s3_env: SeaweedS3, s3_bucket: str) -> str:
    """A fresh prefix in the session's bucket, as an ``s3://`` location."""
    return f"s3://{s3_bucket}/t{next(_bucket_ids)}/ckpt"


@pytest.fixture(params=["file", "s3"])
def storage_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """Every storage test runs against ``file://`` and against SeaweedFS."""
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    return request.getfixturevalue("s3_location")
