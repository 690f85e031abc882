"""The inference worker as real uvicorn processes: a paced one to cut, a fast one for references."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.services.models.procs import ServerProcess, running

#: Slow enough that a generation of ~60 tokens takes ~2 s and each cut lands mid-stream.
TOKENS_PER_SECOND = 30


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = {"tokens_per_second": TOKENS_PER_SECOND, "time_to_first_token_s": 0.05}
    with running("inference_worker", config, tmp_path_factory.mktemp("worker")) as proc:
        yield proc


@pytest.fixture(scope="module")
def fast_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running("inference_worker", {}, tmp_path_factory.mktemp("fast-worker")) as proc:
        yield proc
