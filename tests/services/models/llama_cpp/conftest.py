"""llama.cpp's llama-server serving the tiny generated model: one server, and a fleet of two."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.llama_cpp import LlamaServer, llama_server_binary, tiny_model

from gym_services.models.llama_cpp.tiny_model import TinyModel


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return llama_server_binary()


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    return tiny_model()


@pytest.fixture(scope="module")
def llama_server(
    llama_binary: Path, tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    server = LlamaServer(llama_binary, tiny, tmp_path_factory.mktemp("llama-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama_fleet(
    llama_binary: Path, tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[LlamaServer]]:
    servers: list[LlamaServer] = []
    try:
        for i in range(2):
            servers.append(LlamaServer(llama_binary, tiny, tmp_path_factory.mktemp(f"llama-fleet-{i}")))
        yield servers
    finally:
        for server in servers:
            server.stop()
