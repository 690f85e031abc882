"""Checkpoint a session after k tool calls, restore it into a fresh app, continue.

Every tool output, the seed reply and the verify reply of the restored run must equal an
uninterrupted run byte for byte: for each of the twelve shipped tasks (all nine domains, every
tool) cut at several calls on file://, and cut halfway on a real S3 (SeaweedFS); and for random sessions over all
domains (odd environments, minted IDs, messages stored as dicts, non-finite numbers) cut at a random call.
"""

from __future__ import annotations

import json
import random

import pytest
from tests.conformance import ipi_cases
from tests.services.resources.indirect_prompt_injection.scenarios import (
    EXPECTED,
    SEQUENCES,
    TASKS,
    Call,
    Reply,
    fresh_app,
    ident,
    resolve,
    verify_body,
)
from tests.support.asgi import Control, serve

from gym_services.resources.indirect_prompt_injection.tools import DOMAINS


def cuts_of(task_index: int) -> list[int]:
    n = len(SEQUENCES[task_index])
    return sorted({0, 1, n // 2, n})


CASES = [(t, cut) for t in sorted(SEQUENCES) for cut in cuts_of(t)]


async def _call(client, calls: list[Call], done: list[Reply], i: int, headers: dict | None = None) -> Reply:
    """Call ``calls[i]`` with minted-ID placeholders resolved from the outputs so far."""
    name, args = resolve([calls[i]], [r.body.decode() for r in done])[0]
    return Reply.of(await client.post(f"/{name}", json=args, headers=headers or {}))


def _verify(task_index: int, replies: list[Reply]) -> dict:
    calls = resolve(SEQUENCES[task_index], [r.body.decode() for r in replies])
    return verify_body(TASKS[task_index], calls, replies)


async def run_uninterrupted(task_index: int) -> list[Reply]:
    task, calls = TASKS[task_index], SEQUENCES[task_index]
    async with serve(fresh_app()) as client:
        replies = [Reply.of(await client.post("/seed_session", json=task))]
        for i in range(len(calls)):
            replies.append(await _call(client, calls, replies[1:], i))
        replies.append(Reply.of(await client.post("/verify", json=_verify(task_index, replies[1:]))))
    return replies


async def run_checkpointed(task_index: int, cut: int, storage_url: str) -> list[Reply]:
    task, calls = TASKS[task_index], SEQUENCES[task_index]
    rollout = f"ipi-{task_index}"
    old, new = ident(task_index, 0), ident(task_index, 1)
    async with serve(fresh_app()) as client:
        replies = [Reply.of(await client.post("/seed_session", json=task, headers=old))]
        cookies = dict(client.cookies)
        for i in range(cut):
            replies.append(await _call(client, calls, replies[1:], i, old))
        committed = await Control(client).checkpoint(f"ck-{task_index}-{cut}", storage_url, episodes=[rollout])
        assert committed["records"] == 1 and committed["episodes"] == [rollout]

    # the first process is gone; a fresh one restores the checkpoint
    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        restored = await control.restore(
            f"ck-{task_index}-{cut}", storage_url, committed["manifest_key"], committed["manifest_sha256"]
        )
        assert restored["episodes"] == {rollout: 1}
        await control.resume(f"ck-{task_index}-{cut}")
        client.cookies.update(cookies)
        # a late call of the old attempt is refused and changes nothing
        name, args = calls[min(cut, len(calls) - 1)]
        late = await client.post(f"/{name}", json=args, headers=old)
        assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
        for i in range(cut, len(calls)):
            replies.append(await _call(client, calls, replies[1:], i, new))
        replies.append(Reply.of(await client.post("/verify", json=_verify(task_index, replies[1:]), headers=new)))
        # verification ended the session: the restored server holds nothing any more
        assert (await control.status())["live"] == {"sessions": 0}
        assert client._transport.app.state.sessions.sessions == {}
    return replies


async def check_restored_run(task_index: int, cut: int, storage_url: str) -> None:
    expected = await run_uninterrupted(task_index)
    got = await run_checkpointed(task_index, cut, storage_url)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"reply {i} differs:\n restored: {a.body!r}\n original: {b.body!r}"
    assert all(r.status == 200 for r in got), [r for r in got if r.status != 200]
    verdict = json.loads(got[-1].body)
    assert (verdict["reward"], verdict["injection_followed"]) == EXPECTED[task_index]
    assert got[0].verify_header == "wait"


@pytest.mark.parametrize(("task_index", "cut"), CASES)
async def test_restored_session_answers_like_uninterrupted(tmp_path, task_index: int, cut: int) -> None:
    await check_restored_run(task_index, cut, f"file://{tmp_path / 'store'}")


@pytest.mark.parametrize("task_index", sorted(SEQUENCES))
async def test_restored_session_answers_like_uninterrupted_on_s3(s3_location: str, task_index: int) -> None:
    await check_restored_run(task_index, len(SEQUENCES[task_index]) // 2, s3_location)


def test_sequences_call_every_tool_of_every_domain() -> None:
    """The scenarios above call every tool of all nine domains (so all of them are checkpoint-tested)."""
    assert {task["domain"] for task in TASKS} == set(DOMAINS)
    for task in TASKS:
        declared = {tool["name"] for tool in task["responses_create_params"]["tools"]}
        assert declared <= set(DOMAINS[task["domain"]])
    called = {name for calls in SEQUENCES.values() for name, _ in calls}
    every = {name for tools in DOMAINS.values() for name in tools}
    assert every - called == set()


async def _replay(steps: list[dict], cut: int, location: str, label: str) -> tuple[list, list]:
    """Run the steps uninterrupted, and with a checkpoint/restore after ``cut`` of them; both answer lists."""

    async def send(client, step, headers):
        content = step["body"].encode() if step.get("body") is not None else None
        ctype = {"content-type": step["content_type"]} if step.get("content_type") else {}
        resp = await client.request(step["method"], step["path"], content=content, headers={**ctype, **headers})
        return resp.status_code, resp.content

    old, new = {"x-ng-rollout-id": label, "x-ng-attempt": "0"}, {"x-ng-rollout-id": label, "x-ng-attempt": "1"}
    async with serve(fresh_app()) as client:
        straight = [await send(client, step, old) for step in steps]
    async with serve(fresh_app()) as client:
        first = [await send(client, step, old) for step in steps[:cut]]
        cookies = dict(client.cookies)
        committed = await Control(client).checkpoint(label, location, episodes=[label])
    async with serve(fresh_app(), base_url="http://fresh") as client:
        control = Control(client)
        await control.restore(label, location, committed["manifest_key"], committed["manifest_sha256"])
        await control.resume(label)
        client.cookies.update(cookies)
        rest = [await send(client, step, new) for step in steps[cut:]]
    return straight, first + rest


@pytest.mark.parametrize("seed", range(24))
async def test_random_sessions_restore_exactly(tmp_path, seed: int) -> None:
    """Random sessions of every domain (odd environments included), cut anywhere: same answers."""
    rng = random.Random(seed)
    domain = ipi_cases.DOMAINS[seed % len(ipi_cases.DOMAINS)]
    steps = ipi_cases.random_sequence(rng, domain, calls=(6, 12))
    if seed % 4 == 0:  # a non-finite number in the environment and in an argument
        steps[0]["body"] = steps[0]["body"].replace('"domain"', '"score": NaN, "limit": -Infinity, "domain"', 1)
        steps.insert(
            2, ipi_cases.step("/update_product_stock", raw='{"product_id": "P-2001", "stock_quantity": Infinity}')
        )
    cut = rng.randint(1, len(steps))
    straight, restored = await _replay(steps, cut, f"file://{tmp_path}", f"rand-{seed}")
    assert restored == straight
