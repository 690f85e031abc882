"""Run a scenario through our agent and compare what both agents sent and answered.

``run_ours(case)`` drives our real agent app through its ``/run`` route (in process, every downstream
call over an ASGI transport to the scripted model and environment); ``reference(oracle, case)`` drives
NeMo Gym's agent in the oracle. Both return the same shape: the ``/run`` status and text, and every
request the scripted model and environment received (path, JSON body, cookies). ``compare`` lists
every difference as a :class:`Diff`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from tests.conformance.replay import agent_app
from tests.conformance.scripted import ScriptedModel, ScriptedServer
from tests.services.agents.wire import Wire, running


def row_of(case: dict[str, Any], index: int) -> dict[str, Any]:
    """The case's row with NeMo Gym's own rollout identity fields (both agents pass them through)."""
    row = dict(case["row"])
    if "_ng_task_index" not in row:
        row.update({"_ng_task_index": index, "_ng_rollout_index": 0})
    return row


def reference(oracle: Any, case: dict[str, Any], index: int) -> dict[str, Any]:
    return oracle.call(
        "agents",
        "run_episode",
        case["kind"],
        case["config"],
        row_of(case, index),
        case["script"],
        case["env"],
        case["model_cookies"],
    )


def _received(items: list[Any]) -> list[dict[str, Any]]:
    return [{"path": r.path, "body": r.body, "cookies": r.cookies, "status": r.status} for r in items]


async def run_ours(case: dict[str, Any], index: int, **config: Any) -> dict[str, Any]:
    model = ScriptedModel({"default": case["script"]}, set_cookies=case["model_cookies"])
    env = ScriptedServer(case["env"])
    wire = Wire()
    wire.apps.update(
        {"model": model.app, "env": env.app, "agent": agent_app(case["kind"], wire, **{**case["config"], **config})}
    )
    async with running(wire), httpx.AsyncClient(transport=wire, timeout=60) as http:
        reply = await http.post("http://agent/run", json=row_of(case, index))
    return {
        "status": reply.status_code,
        "text": reply.text,
        "model_requests": _received(model.received.get("default", [])),
        "env_requests": _received(env.received),
    }


@dataclass(frozen=True)
class Diff:
    case: str
    area: str  # run_status, run_answer, model_requests, model_request, env_requests, env_request
    where: str  # a path inside the compared value
    reference: str
    ours: str

    def __str__(self) -> str:
        return f"[{self.case}] {self.area} {self.where}: reference {self.reference} / ours {self.ours}"


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()


def value_diffs(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every path where ``a`` and ``b`` differ (JSON values; dict key order ignored, list order not)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += value_diffs(a.get(key, _MISSING), b.get(key, _MISSING), f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += value_diffs(x, y, f"{path}[{i}]")
        return out
    if a is _MISSING or b is _MISSING or type(a) is not type(b) or a != b:
        return [(path or ".", "<absent>" if a is _MISSING else a, "<absent>" if b is _MISSING else b)]
    return []


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _cookies(request: dict[str, Any], names: set[str]) -> dict[str, str]:
    return {k: v for k, v in request["cookies"].items() if k in names}


def compare(case: dict[str, Any], ref: dict[str, Any], ours: dict[str, Any]) -> list[Diff]:
    name = case["name"]
    diffs: list[Diff] = []

    def add(area: str, where: str, a: Any, b: Any) -> None:
        diffs.append(Diff(name, area, where, _short(a), _short(b)))

    if ref["status"] != ours["status"]:
        add("run_status", ".", ref["status"], ours["status"])
    for where, a, b in value_diffs(_parsed(ref["text"]), _parsed(ours["text"])):
        add("run_answer", where, a, b)

    scripted_cookies = set(case["model_cookies"])
    for answers in case["env"].values():
        for answer in answers:
            scripted_cookies |= set(answer.get("cookies") or {})

    for area in ("model_requests", "env_requests"):
        r, o = ref[area], ours[area]
        if [x["path"] for x in r] != [x["path"] for x in o]:
            add(area, "paths", [x["path"] for x in r], [x["path"] for x in o])
        for i, (x, y) in enumerate(zip(r, o, strict=False)):  # differing paths are reported above
            single = area[:-1]
            for where, a, b in value_diffs(x["body"], y["body"]):
                add(single, f"[{i}] {x['path']} body{where}", a, b)
            cx, cy = _cookies(x, scripted_cookies), _cookies(y, scripted_cookies)
            if cx != cy:
                add(single, f"[{i}] {x['path']} cookies", cx, cy)
    return diffs


@dataclass(frozen=True)
class Allowed:
    """A deliberate difference: which diffs it covers and why."""

    area: str
    where: str  # a regular expression on Diff.where
    reason: str
    case: str = ".*"

    def covers(self, diff: Diff) -> bool:
        return (
            diff.area == self.area
            and re.search(self.where, diff.where) is not None
            and re.fullmatch(self.case, diff.case) is not None
        )
