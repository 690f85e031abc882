"""Checkpoint a session after 0, 1, 2, ... tool calls, restore it into a fresh app, continue.

Every tool output, the seed reply and the verify reply of the restored run must equal an
uninterrupted run byte for byte, for each of the five shipped tasks, on file:// and on
a real S3 (SeaweedFS).
"""

from __future__ import annotations

import json

import pytest

from tests.services.resources.indirect_prompt_injection.scenarios import (
    EXPECTED,
    SEQUENCES,
    TASKS,
    Reply,
    fresh_app,
    ident,
    verify_body,
)
from tests.support.asgi import Control, serve

CUTS = ["0", "1", "2", "3", "4", "all"]


async def run_uninterrupted(task_index: int) -> list[Reply]:
    task, calls = TASKS[task_index], SEQUENCES[task_index]
    async with serve(fresh_app()) as client:
        replies = [Reply.of(await client.post("/seed_session", json=task))]
        for name, args in calls:
            replies.append(Reply.of(await client.post(f"/{name}", json=args)))
        replies.append(Reply.of(await client.post("/verify", json=verify_body(task, calls, replies[1:]))))
    return replies


async def run_checkpointed(task_index: int, cut: int, storage_url: str) -> list[Reply]:
    task, calls = TASKS[task_index], SEQUENCES[task_index]
    rollout = f"ipi-{task_index}"
    old, new = ident(task_index, 0), ident(task_index, 1)
    async with serve(fresh_app()) as client:
        replies = [Reply.of(await client.post("/seed_session", json=task, headers=old))]
        cookies = dict(client.cookies)
        for name, args in calls[:cut]:
            replies.append(Reply.of(await client.post(f"/{name}", json=args, headers=old)))
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
        for name, args in calls[cut:]:
            replies.append(Reply.of(await client.post(f"/{name}", json=args, headers=new)))
        body = verify_body(task, calls, replies[1:])
        replies.append(Reply.of(await client.post("/verify", json=body, headers=new)))
        # verification ended the session: the restored server holds nothing any more
        assert (await control.status())["live"] == {"sessions": 0}
        assert client._transport.app.state.sessions.sessions == {}
    return replies


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("task_index", sorted(SEQUENCES))
async def test_restored_session_answers_like_uninterrupted(storage_url: str, task_index: int, cut: str) -> None:
    n = len(SEQUENCES[task_index]) if cut == "all" else int(cut)
    expected = await run_uninterrupted(task_index)
    got = await run_checkpointed(task_index, n, storage_url)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"reply {i} differs:\n restored: {a.body!r}\n original: {b.body!r}"
    verdict = json.loads(got[-1].body)
    assert (verdict["reward"], verdict["injection_followed"]) == EXPECTED[task_index]
    assert got[0].verify_header == "wait"


async def test_sequences_exercise_every_tool_of_the_task_schemas() -> None:
    """The scenarios above call every tool the five tasks declare (so all of them are checkpoint-tested)."""
    declared = {tool["name"] for task in TASKS for tool in task["responses_create_params"]["tools"]}
    called = {name for calls in SEQUENCES.values() for name, _ in calls}
    assert declared - called == set()
