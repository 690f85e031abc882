"""S3 clients are shared per access: one per endpoint, region, keys and AWS_* variables, made on the first request."""

from __future__ import annotations

import pytest

from gym_services.base.config import StorageConfig
from gym_services.control.storage import open_storage
from gym_services.control.storage.s3 import SharedClients


def test_one_client_per_access_and_environment(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    clients = SharedClients(keep=2)
    a = StorageConfig()
    assert clients(a) is clients(StorageConfig())  # the same access: the same client
    other = clients(StorageConfig(region="eu-west-1"))
    assert other is not clients(a)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another-key")  # boto3 would read other credentials: another client
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret")
    rotated = clients(a)
    assert rotated is not other and rotated.meta.region_name == "us-east-1"
    assert len(clients._clients) == 2 and len(clients._sessions) <= 2  # the oldest went


def test_credentials_boto3_refuses_are_a_storage_error_and_start_up_goes_on(monkeypatch) -> None:
    from gym_services.control.storage import StorageError
    from gym_services.control.storage_clients import StorageClients

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a-key-without-its-secret")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(StorageError, match="AWS_SECRET_ACCESS_KEY"):
        SharedClients()(StorageConfig())
    clients = StorageClients(StorageConfig(), "test")
    try:
        assert clients.warm() is False  # logged; the server starts, and a checkpoint to S3 fails with the reason
    finally:
        clients.shutdown()


def test_opening_a_location_makes_no_client() -> None:
    made: list[StorageConfig] = []
    storage = open_storage("s3://bucket/prefix", StorageConfig(endpoint_url="http://127.0.0.1:1"), made.append)
    assert storage.url == "s3://bucket/prefix" and made == []
