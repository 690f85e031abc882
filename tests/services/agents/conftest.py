"""The inference worker as a real uvicorn process on 127.0.0.1 for the agent tests (the policy model streams from
it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.services.models.procs import ServerProcess, running

#: Paced so that a generation takes a few hundred milliseconds and a checkpoint can cut it mid-stream.
TOKENS_PER_SECOND = 150


@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = {"tokens_per_second": TOKENS_PER_SECOND, "time_to_first_token_s": 0.02}
    with running("inference_worker", config, tmp_path_factory.mktemp("agents-worker")) as proc:
        yield proc
