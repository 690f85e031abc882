"""Scope never drops a session silently (``docs/protocol.md``, "Scope"): a session of a rollout that is not one of
the checkpoint's episodes is dropped and named, in the capture and persist answers, the transaction's result, the
CLI's result lines and ``gymckpt checkpoints show``; a session seeded without identity is kept, and named too."""

from __future__ import annotations

import httpx
from tests.services.resources.common.notebook import notebook_app
from tests.support.asgi import TOKEN, Control, base_config, serve, serve_many

from gym_services import cli
from gym_services.base.config import ServerConfig, load_config
from gym_services.commands.output import transaction_summary
from gym_services.control.models import SCOPE_NAMED, ScopeReport
from gym_services.control.participant import NothingToRestore, Record, Scope
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.server.app import create_server_app


async def seed(client: httpx.AsyncClient, note: str, **headers: str) -> dict[str, str]:
    """A new session (its own cookie) holding one note; its cookies."""
    client.cookies.clear()
    assert (await client.post("/seed_session", headers=headers)).status_code == 200
    assert (await client.post("/put", json={"key": "k", "value": note}, headers=headers)).status_code == 200
    return dict(client.cookies)


def test_the_report_names_a_bounded_few_and_counts_all() -> None:
    sessions = {f"s{n:03}": f"r{n}" for n in range(SCOPE_NAMED + 5)} | {"anon": None, "kept": "r-in"}
    dropped, report = Scope.of(["r-in"]).leave_out(sessions)
    assert len(dropped) == report.dropped_total == SCOPE_NAMED + 5 and "kept" not in dropped and "anon" not in dropped
    assert len(report.dropped) == SCOPE_NAMED and report.unowned_total == 1
    assert "and 5 more" in report.lines("notebook")[0]
    assert Scope.of(None).leave_out({"a": "r1"}) == (set(), ScopeReport())


async def test_dropped_and_unowned_sessions_are_named_by_the_participant(tmp_path) -> None:
    location = f"file://{tmp_path}"
    async with serve(notebook_app()) as client:
        kept = await seed(client, "kept", **{"x-ng-rollout-id": "r1"})
        lost = await seed(client, "lost", **{"x-ng-rollout-id": "r7"})
        anonymous = await seed(client, "anonymous")
        control = Control(client)
        await control.prepare("ck")
        captured = await control.capture("ck", location, episodes=["r1"])
        await control.resume("ck")
        persisted = await control.persist("ck")
    for answer in (captured, persisted):
        assert answer["records"] == 2
        (dropped,) = answer["scope"]["dropped"]
        assert dropped["rollout_id"] == "r7" and answer["scope"]["dropped_total"] == 1
        assert answer["scope"]["unowned_total"] == 1 and len(answer["scope"]["unowned"]) == 1
    async with serve(notebook_app()) as client:
        control = Control(client)
        await control.restore("ck", location, persisted["manifest_key"])
        await control.resume("ck")
        restored = {"x-ng-rollout-id": "r1", "x-ng-attempt": "1"}
        for cookies, note, headers in ((kept, "kept", restored), (anonymous, "anonymous", {})):
            client.cookies.clear()
            client.cookies.update(cookies)
            assert (await client.post("/get", json={"key": "k"}, headers=headers)).json() == {"value": note}
        client.cookies.clear()
        client.cookies.update(lost)
        gone = await client.post("/get", json={"key": "k"})  # as the report said: not in the checkpoint
        assert gone.json()["error"]["code"] == "session_not_found"


class Controller(NothingToRestore):
    """A collection controller whose one live episode is r1: the checkpoint's scope."""

    role = "controller"

    async def export(self, scope: Scope) -> list[Record]:
        return [Record("episode-r1", b"{}", "r1", 0)]


async def test_the_transaction_result_the_cli_and_checkpoints_show_name_them(tmp_path, capsys) -> None:
    location = f"file://{tmp_path / 'store'}"
    controller = create_server_app(load_config(ServerConfig, overrides=base_config("controller")), Controller(), [])
    apps = {"controller": controller, "notebook": notebook_app()}
    refs = [
        ParticipantRef("controller", "controller", "http://controller"),
        ParticipantRef("notebook", "resources", "http://notebook"),
    ]
    async with serve_many(apps) as transport:
        async with httpx.AsyncClient(transport=transport, base_url="http://notebook") as http:
            await seed(http, "kept", **{"x-ng-rollout-id": "r1"})
            await seed(http, "lost", **{"x-ng-rollout-id": "r7"})
            lost_session = apps["notebook"].state.participant.sessions
        async with ControlClient(TOKEN, transport=transport) as client:
            result = await Coordinator(refs, client).checkpoint("ck-1", location, prepare_timeout_s=5)
    assert result.completed, result.error
    (lost_sid,) = [sid for sid, ident in lost_session.items() if ident is not None and ident.rollout_id == "r7"]
    notebook = next(p for p in result.participants if p.participant_id == "notebook")
    assert [s.session_id for s in notebook.scope.dropped] == [lost_sid]
    assert "scope: notebook: 1 sessions dropped" in transaction_summary(result)
    assert f"{lost_sid} (rollout r7)" in transaction_summary(result)
    assert cli.main(["checkpoints", "show", "ck-1", "--storage", location]) == 0
    shown = capsys.readouterr().out
    assert "scope: notebook: 1 sessions dropped" in shown and f"{lost_sid} (rollout r7)" in shown
