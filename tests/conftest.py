"""Fixtures shared by every test folder."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import pytest

from tests.support.processes import MARK, reap_leaked
from tests.support.seaweed import SeaweedS3, start_seaweed

pytest_plugins = ["tests.support.schedule"]

_bucket_ids = itertools.count()
_test_marks = itertools.count()
_fixture_marks = itertools.count()
_MARK_KEY = pytest.StashKey[str]()


def _test_mark(item: pytest.Item) -> str:
    return item.stash.setdefault(_MARK_KEY, f"{os.getpid()}-{next(_test_marks)}")


@contextlib.contextmanager
def _marking(tag: str) -> Iterator[None]:
    """Processes started meanwhile carry ``tag`` (nested: a broader fixture set up inside a test's setup)."""
    previous = os.environ.get(MARK)
    os.environ[MARK] = tag
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = previous


def _fail_if_leaked(tag: str, owner: str) -> None:
    leaked = reap_leaked(tag)
    if leaked:
        pytest.fail(
            f"processes started by {owner} were left running (now killed): "
            + "; ".join(f"{pid}: {cmd[:160]}" for pid, cmd in sorted(leaked.items())),
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Every process started while a test runs - its setup, the test function, its teardown - carries a mark of
    this test (see tests/support/processes.py), except what a broader-scoped fixture starts (below)."""
    with _marking(_test_mark(item)):
        return (yield)


class _FixtureMarks:
    """A plugin, not a conftest hook: pytest asks a conftest's hooks only about nodes under its folder, and a
    session-scoped fixture is set up for the session node (the rootdir)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[object]:
        """A function-scoped fixture's processes carry its test's mark (checked with the test's); a broader-scoped
        fixture's carry a mark of their own, checked once that fixture is torn down: whatever it started and did
        not stop is killed, and the teardown fails naming it. Registered before the fixture runs, so the check
        runs after the fixture's own teardown."""
        if fixturedef.scope == "function":
            return (yield)
        tag = f"{os.getpid()}-{fixturedef.argname}-{next(_fixture_marks)}"
        owner = f"fixture {fixturedef.argname!r} ({fixturedef.scope} scope)"
        fixturedef.addfinalizer(lambda: _fail_if_leaked(tag, owner))
        with _marking(tag):
            return (yield)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("gymckpt-fixture-marks"):
        config.pluginmanager.register(_FixtureMarks(), "gymckpt-fixture-marks")


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Torn down after the test's other fixtures: a process the test (or one of its function-scoped fixtures)
    started and nobody stopped is killed, and the test fails naming it (every process a test or fixture starts
    is stopped in a finalizer, pass or fail)."""
    yield
    _fail_if_leaked(_test_mark(request.node), "this test or its fixtures")


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
