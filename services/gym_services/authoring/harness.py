"""The conformance harness an author runs against their own server (``gymckpt check-server``, ``docs/authoring.md``).

It checks what the checkpoint contract promises, on real processes:

1. **uninterrupted**: one fresh process runs every episode (:mod:`gym_services.authoring.episodes`) to the end; its
   answers are the reference.
2. **rounds** (``rounds``, each at a point drawn from ``seed``): a fresh process runs the same calls up to a random
   call, takes a checkpoint (the coordinator, over the server's control routes, into ``file://`` storage), goes on
   a few calls more (work the crash loses), and is killed with SIGKILL. A fresh process restores the checkpoint;
   then a late call of the old attempt is tried on a restored session, with its identity headers and without any,
   and must be refused (``409 stale_attempt``); then every episode continues from where the checkpoint found it,
   as attempt + 1, and every answer must equal the uninterrupted run's.
3. **the declared mode** (``checkpoint_mode`` on the control status route) must match what the server holds:
   ``exported`` saves a record per live session, ``restart_only`` refuses a checkpoint while sessions live,
   ``stateless`` holds no sessions (and loses nothing: the answers after a restore still match).

Each finding is a :class:`Check` of the :class:`Report`.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx

from gym_services.authoring.episodes import Episodes, answer_of, schedule
from gym_services.authoring.processes import Launch, ServerProcess, started
from gym_services.base.config import StorageConfig
from gym_services.base.identity import ATTEMPT_HEADER, FIRST_SESSION_HEADER, ROLLOUT_ID_HEADER
from gym_services.base.text import table
from gym_services.control.protocol import CheckpointMode, Role
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.coordination.transaction import TransactionResult

#: at most this many differing answers are named in a check's detail
SHOWN = 3


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Report:
    server: str
    mode: str | None = None
    checks: list[Check] = field(default_factory=list)
    #: every ``reward`` the uninterrupted run's answers carried, in call order
    rewards: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append(Check(name, ok, detail))

    def text(self) -> str:
        rows = [["ok" if c.ok else "FAIL", c.name, c.detail] for c in self.checks]
        verdict = "passes" if self.ok else "FAILS"
        return f"{self.server} (checkpoint_mode {self.mode}): {verdict}\n" + table(["", "check", "detail"], rows)


class Driver:
    """Sends the episodes' calls, each episode with its own cookies (as an agent keeps them per server)."""

    def __init__(self, episodes: Episodes, http: httpx.AsyncClient) -> None:
        self.episodes = episodes
        self.http = http
        self.cookies: list[dict[str, str]] = [{} for _ in episodes.episodes]

    def rollout_id(self, episode: int) -> str:
        return f"check-{episode}"

    async def call(
        self, url: str, episode: int, index: int, *, attempt: int | None, keep_cookies: bool = True
    ) -> dict[str, Any]:
        """One call; ``attempt`` None sends no identity headers. Returns what :func:`answer_of` compares."""
        call = self.episodes.episodes[episode][index]
        headers: dict[str, str] = {}
        if attempt is not None:
            headers = {ROLLOUT_ID_HEADER: self.rollout_id(episode), ATTEMPT_HEADER: str(attempt)}
            if not self.cookies[episode]:
                headers[FIRST_SESSION_HEADER] = "1"
        if self.cookies[episode]:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies[episode].items())
        kwargs: dict[str, Any] = {"headers": headers}
        if call.json_body is not None:
            kwargs["json"] = call.json_body
        resp = await self.http.request(call.method, url + call.path, **kwargs)
        self.http.cookies.clear()  # the client's own jar would share one episode's cookies with every other
        if keep_cookies:
            for name, value in resp.cookies.items():
                self.cookies[episode][name] = value
        return answer_of(resp.status_code, resp.content, self.episodes.ignore_fields)

    def jars(self) -> list[dict[str, str]]:
        """Every episode's cookies as they are now (what an agent's boundary keeps)."""
        return [dict(jar) for jar in self.cookies]

    def restore(self, jars: list[dict[str, str]]) -> None:
        self.cookies = [dict(jar) for jar in jars]


async def check_server(
    launch: Launch, episodes: Episodes, *, rounds: int = 3, seed: int = 0, say: Any = None
) -> Report:
    """Run every check against the server ``launch`` starts; ``say(text)`` hears progress."""
    report = Report(launch.server)
    order = schedule(episodes, seed)
    rng = random.Random(seed)
    tell = say or (lambda text: None)
    tell(f"uninterrupted run: {len(episodes.episodes)} episodes, {len(order)} calls")
    baseline = await uninterrupted(launch, episodes, order, report)
    if baseline is None:
        return report
    for number in range(rounds):
        cut = rng.randint(1, max(1, len(order) - 1))
        lost = rng.randint(cut, min(len(order), cut + max(1, len(order) // 4)))
        tell(f"round {number + 1}/{rounds}: checkpoint after call {cut}, SIGKILL after call {lost}, restore")
        await one_round(launch, episodes, order, baseline, report, Cut(number, cut, lost))
    return report


async def uninterrupted(
    launch: Launch, episodes: Episodes, order: list[tuple[int, int]], report: Report
) -> dict[tuple[int, int], dict[str, Any]] | None:
    """Every answer of one run without a checkpoint; the mode the server declares, and the sessions it held."""
    answers: dict[tuple[int, int], dict[str, Any]] = {}
    most = 0
    with started(launch, "uninterrupted") as proc:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http, _control(launch) as control:
            driver = Driver(episodes, http)
            for episode, index in order:
                answers[(episode, index)] = await driver.call(proc.url, episode, index, attempt=0)
                status = await control.status(_ref(launch, proc))
                report.mode = str(status.checkpoint_mode)
                most = max(most, int(status.live.get("sessions", 0) or 0))
    if report.mode == CheckpointMode.STATELESS and most:
        report.add(
            "declared mode",
            False,
            f"declares stateless but held {most} live sessions: a checkpoint would lose them "
            "(declare exported and implement the session hooks, or restart_only)",
        )
    for episode, index in order:
        body = answers[(episode, index)].get("json")
        if isinstance(body, dict) and isinstance(body.get("reward"), int | float):
            report.rewards.append(float(body["reward"]))
    refused = [key for key, answer in answers.items() if answer["status"] >= 500]
    if refused:
        episode, index = refused[0]
        detail = f"{len(refused)} calls answered 5xx, the first episode {episode} call {index}"
        report.add("uninterrupted run", False, detail)
        return None
    report.add("uninterrupted run", True, f"{len(answers)} calls, at most {most} live sessions")
    return answers


@dataclass(frozen=True)
class Cut:
    """One round: the checkpoint after call ``at``, the crash after call ``lost``."""

    number: int
    at: int
    lost: int


async def one_round(
    launch: Launch,
    episodes: Episodes,
    order: list[tuple[int, int]],
    baseline: dict[tuple[int, int], dict[str, Any]],
    report: Report,
    cut: Cut,
) -> None:
    name = f"round {cut.number + 1} (checkpoint after call {cut.at})"
    checkpoint_id = f"check-{cut.number}-{secrets.token_hex(3)}"
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http, _control(launch) as control:
        driver = Driver(episodes, http)
        with started(launch, f"round-{cut.number}-before") as before:
            differ = [key for key in order[: cut.at] if await _differs(driver, before.url, key, baseline, 0)]
            live = (await control.status(_ref(launch, before))).live.get("sessions", 0) or 0
            coordinator = await _coordinator(launch, before, control)
            result = await coordinator.checkpoint(checkpoint_id, _location(launch), prepare_timeout_s=30, lease_s=30)
            at_checkpoint = driver.jars()
            for key in order[cut.at : cut.lost]:  # work the crash loses
                await driver.call(before.url, *key, attempt=0)
        if not _checkpointed(report, name, result, live):
            return
        with started(launch, f"round-{cut.number}-after") as after:
            coordinator = await _coordinator(launch, after, control)
            restored = await coordinator.restore(checkpoint_id, _location(launch), lease_s=30)
            if not restored.completed:
                report.add(name, False, f"restore {restored.status}: {restored.error}")
                return
            driver.restore(at_checkpoint)
            await late_calls(driver, after, order, cut, restored.episodes, report)
            for episode, index in order[cut.at :]:
                attempt = restored.episodes.get(driver.rollout_id(episode), 1)
                if await _differs(driver, after.url, (episode, index), baseline, attempt):
                    differ.append((episode, index))
    report.add(name, not differ, _differences(episodes, differ, restored.episodes, live))


def _checkpointed(report: Report, name: str, result: TransactionResult, live: int) -> bool:
    """Whether the round goes on to a restore; what the checkpoint's outcome says of the declared mode."""
    if report.mode == CheckpointMode.RESTART_ONLY:
        refused = not result.completed and bool(result.blockers)
        if live:
            report.add(f"{name}: restart_only", refused, f"refused while {live} sessions live" if refused else "")
        return result.completed
    if not result.completed:
        blockers = "; ".join(f"{b.kind} {b.id}: {b.detail}" for b in result.blockers[:SHOWN])
        report.add(name, False, f"checkpoint {result.status}: {result.error or ''} {blockers}".strip())
        return False
    if report.mode == CheckpointMode.EXPORTED and result.records < live:
        detail = f"{live} live sessions, but the checkpoint holds {result.records} records"
        report.add(f"{name}: exported", False, detail)
    return True


async def late_calls(
    driver: Driver,
    proc: ServerProcess,
    order: list[tuple[int, int]],
    cut: Cut,
    restored: dict[str, int],
    report: Report,
) -> None:
    """A call of the old attempt on a restored session, with headers naming attempt 0 and with none: both refused."""
    done = {key for key in order[: cut.at]}
    pending = [(e, i) for e, i in order[cut.at :] if driver.rollout_id(e) in restored and (e, i - 1) in done]
    if not pending:
        report.add("late old-attempt call", True, "no restored episode had a call left")
        return
    episode, index = pending[0]
    for label, attempt in (("with x-ng-attempt: 0", 0), ("without identity headers", None)):
        answer = await driver.call(proc.url, episode, index, attempt=attempt, keep_cookies=False)
        code = (answer.get("json") or {}).get("error", {}) if isinstance(answer.get("json"), dict) else {}
        refused = answer["status"] == 409 and isinstance(code, dict) and code.get("code") == "stale_attempt"
        detail = "409 stale_attempt" if refused else f"answered {answer['status']}: the old attempt reached the session"
        report.add(f"late old-attempt call {label}", refused, detail)


async def _differs(
    driver: Driver, url: str, key: tuple[int, int], baseline: dict[tuple[int, int], dict[str, Any]], attempt: int
) -> bool:
    return await driver.call(url, *key, attempt=attempt) != baseline[key]


def _differences(episodes: Episodes, differ: list[tuple[int, int]], restored: dict[str, int], live: int) -> str:
    if not differ:
        return f"{live} live sessions saved, {len(restored)} episodes restored as attempt + 1; every answer equal"
    shown = ", ".join(f"episode {e} call {i} ({episodes.episodes[e][i].path})" for e, i in differ[:SHOWN])
    return f"{len(differ)} answers differ from the uninterrupted run: {shown}"


def _ref(launch: Launch, proc: ServerProcess) -> ParticipantRef:
    return ParticipantRef(launch.participant_id, Role.RESOURCES, proc.url)


def _control(launch: Launch) -> ControlClient:
    return ControlClient(launch.control_token, timeout_s=60)


def _location(launch: Launch) -> str:
    return f"file://{(launch.workdir / 'checkpoints').resolve()}"


async def _coordinator(launch: Launch, proc: ServerProcess, client: ControlClient) -> Coordinator:
    """A coordinator over the one server under check, with the role it reports."""
    status = await client.status(_ref(launch, proc))
    ref = ParticipantRef(status.participant_id, status.role, proc.url)
    return Coordinator([ref], client, storage_config=StorageConfig())


def new_secrets() -> tuple[str, str]:
    """A control token and a session secret for one check (every process of the check shares them)."""
    return secrets.token_urlsafe(24), secrets.token_urlsafe(32)
