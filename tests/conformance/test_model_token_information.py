"""The policy model's token information against NeMo Gym 0.7.0's ``vllm_model`` in front of the same upstream.

Both model servers ask our built-in inference worker (a real uvicorn process on 127.0.0.1, which answers
what vLLM answers) for the same requests; the reference is the wheel's own ``vllm_model`` app with
``return_token_id_information: true`` (once with ``/tokenize`` for the prompt ids, once with
``request_prompt_and_generation_token_ids``), run in the oracle environment. The bodies must agree on
everything a trainer reads: which output items there are (type, role, content, tool calls), which item
carries the token information (the last: NeMo Gym's ``…__training`` variants) and its
``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs``, and the usage. Ids and
timestamps differ by design (ours derive from the request digest; the reference mints random ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.services.models.policy_model.model_support import REQUESTS, model_app
from tests.services.models.procs import ServerProcess, running
from tests.support.asgi import serve

pytestmark = pytest.mark.e2e
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running("inference_worker", {}, tmp_path_factory.mktemp("token-worker")) as proc:
        yield proc


def comparable(response: dict[str, Any]) -> dict[str, Any]:
    """What a trainer reads of a response, without ids and timestamps."""
    items = []
    for item in response["output"]:
        kept = {k: item[k] for k in ("type", "role", "name", "arguments", "status") if k in item}
        if item["type"] == "message":
            kept["content"] = [{k: p.get(k) for k in ("type", "text")} for p in item["content"]]
        kept.update({k: item[k] for k in TOKEN_FIELDS if k in item})
        items.append(kept)
    usage = response.get("usage") or {}
    return {
        "output": items,
        "status": response["status"],
        "incomplete_details": response.get("incomplete_details"),
        "usage": {k: usage.get(k) for k in ("input_tokens", "output_tokens", "total_tokens")},
    }


CASES = {
    **{name: body for name, body in REQUESTS.items()},
    "workplace-limited": {**REQUESTS["workplace"], "max_output_tokens": 17},
    "lean-seeded": {**REQUESTS["lean"], "temperature": 0.6},
}


@pytest.mark.parametrize("request_ids", [False, True], ids=["tokenize", "return_token_ids"])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_token_information_equals_the_reference_vllm_model(
    oracle, worker: ServerProcess, case: str, request_ids: bool
) -> None:
    body = CASES[case]
    model = body["model"]
    (theirs,) = oracle.call("vllm_model", "responses", f"{worker.url}/v1", model, [body], request_ids)
    assert theirs["status"] == 200, theirs
    async with serve(model_app(worker.url, return_token_id_information=True)) as client:
        ours = await client.post("/v1/responses", json=body)
    assert ours.status_code == 200, ours.text
    mine, reference = comparable(ours.json()), comparable(theirs["body"])
    assert mine == reference
    last = mine["output"][-1]
    assert all(field in last for field in TOKEN_FIELDS)
    assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) == mine["usage"]["output_tokens"]
    assert all(not any(field in item for field in TOKEN_FIELDS) for item in mine["output"][:-1])


async def test_without_the_option_no_token_fields(worker: ServerProcess) -> None:
    async with serve(model_app(worker.url)) as client:
        ours = (await client.post("/v1/responses", json=REQUESTS["workplace"])).json()
    assert not any(field in item for item in ours["output"] for field in TOKEN_FIELDS)
