"""Compare the checkpointed run with the uninterrupted one and print the tables."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gym_services.base.text import human_bytes, table
from gym_services.demo.story import Run
from gym_services.models.policy_model.ledger.wire import FrozenRollout


@dataclass
class Verdict:
    ok: bool
    problems: list[str]
    text: str


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


def compare(base: Run, ckpt: Run, agent_env: dict[str, str], *, tokens: bool = True) -> Verdict:
    """Rewards per rollout must match; with ``tokens``, no generated token may be generated again, and every
    rollout's training tokens equal the uninterrupted run's (ids and log-probs, exactly)."""
    problems: list[str] = []
    by_env = _rewards_by_env(base, ckpt, agent_env, problems)
    tokens_by_env = {env: training_tokens_verdict(base, ckpt, s["ids"]) for env, s in by_env.items()}
    regenerated = regenerated_tokens(base, ckpt)
    if tokens:
        problems += _token_problems(base, ckpt, tokens_by_env)
        if regenerated != 0:
            problems.append(f"{regenerated} tokens regenerated after the restore (target 0)")
    problems += _restore_problems(ckpt)
    lines = [
        "rewards per environment:",
        _rewards_table(by_env, tokens_by_env),
        "",
        "checkpoint, crash and restore:",
        table(["", "value"], _summary(base, ckpt, regenerated)),
    ]
    return Verdict(ok=not problems, problems=problems, text="\n".join(lines))


#: environment -> its rollout ids, their rewards in each run, and the rollouts whose reward differs
ByEnv = dict[str, dict[str, list[Any]]]
#: environment -> what :func:`training_tokens_verdict` says of its rollouts
TokensByEnv = dict[str, tuple[str, list[str], int | str]]


def _rewards_by_env(base: Run, ckpt: Run, agent_env: dict[str, str], problems: list[str]) -> ByEnv:
    """Every rollout's reward in both runs, by environment; a reward that differs, a result in one run only, or
    an episode with two results is added to ``problems``."""
    by_env: ByEnv = defaultdict(lambda: {"ids": [], "base": [], "ckpt": [], "diff": []})
    for rid, row in sorted(base.results.items()):
        env = agent_env.get(row.get("agent", ""), row.get("agent", "?"))
        slot = by_env[env]
        slot["ids"].append(rid)
        slot["base"].append(row.get("reward") or 0.0)
        other = ckpt.results.get(rid)
        if other is None:
            problems.append(f"{rid}: no result in the checkpointed run")
            slot["diff"].append(rid)
            continue
        slot["ckpt"].append(other.get("reward") or 0.0)
        if other.get("reward") != row.get("reward") or "error" in other or "error" in row:
            problems.append(
                f"{rid}: reward {other.get('reward')} (checkpointed) vs {row.get('reward')} (uninterrupted)"
                + (f"; error {other.get('error') or row.get('error')}" if "error" in other or "error" in row else "")
            )
            slot["diff"].append(rid)
    extra = sorted(set(ckpt.results) - set(base.results))
    if extra:
        problems.append(f"results only in the checkpointed run: {extra}")
    if ckpt.duplicates or base.duplicates:
        problems.append(f"episodes with two results (ran twice): {sorted(set(ckpt.duplicates + base.duplicates))}")
    return by_env


def _token_problems(base: Run, ckpt: Run, tokens_by_env: TokensByEnv) -> list[str]:
    problems = []
    for env, (_, differing, masked) in sorted(tokens_by_env.items()):
        if differing:
            where = "; ".join(f"{rid}: {token_difference(base, ckpt, rid)}" for rid in differing)
            problems.append(f"{env}: training tokens (result rows, token ledgers) differ in {differing} ({where})")
        if isinstance(masked, int) and masked:
            problems.append(f"{env}: {masked} rollouts masked (a model call lost; a trainer would not train on them)")
    return problems


def _restore_problems(ckpt: Run) -> list[str]:
    """A late call of the old attempt that was not refused; episodes run again after a worker was killed."""
    problems = []
    stale = ckpt.stale_call
    if stale and not (stale.get("status") == 409 and stale.get("code") == "stale_attempt"):
        problems.append(f"a late call of the old attempt was not refused: {stale}")
    if ckpt.worker_killed and ckpt.reruns_before_checkpoint:
        problems.append(
            f"{ckpt.reruns_before_checkpoint} episodes were run again after the worker was killed (target 0)"
        )
    return problems


def _rewards_table(by_env: ByEnv, tokens_by_env: TokensByEnv) -> str:
    rows = [
        [
            env,
            len(s["ids"]),
            _mean(s["base"]),
            _mean(s["ckpt"]),
            "yes" if not s["diff"] else f"NO ({len(s['diff'])})",
            tokens_by_env[env][0],
            tokens_by_env[env][2],
        ]
        for env, s in sorted(by_env.items())
    ]
    headers = ["environment", "episodes", "uninterrupted", "checkpointed", "equal"]
    return table([*headers, "training tokens identical to the uninterrupted run", "masked rollouts"], rows)


def _summary(base: Run, ckpt: Run, regenerated: int) -> list[list[Any]]:
    """The checkpoint, crash and restore in figures: what was live, the pause, the size, and where every token
    went."""
    cp, rs, live, stale, killed = ckpt.checkpoint, ckpt.restore, ckpt.in_flight, ckpt.stale_call, ckpt.worker_killed
    summary: list[list[Any]] = [
        ["episodes live at the checkpoint", live.get("collection", {}).get("episodes", "-")],
        ["model generations in flight (streaming) / held", _model_line(live, "generations")],
        ["checkpoint pause seen by rollouts", f"{cp.pause_s * 1000:.0f} ms" if cp else "-"],
        ["checkpoint size", f"{human_bytes(cp.bytes)} in {cp.records} records" if cp else "-"],
        [
            "restore into fresh processes",
            f"{rs.pause_s * 1000:.0f} ms, {len(rs.episodes)} episodes as attempt + 1" if rs else "-",
        ],
        ["tokens, uninterrupted run", base.tokens_generated],
        ["tokens before the cut (in the checkpoint)", ckpt.tokens_before_cut],
        ["tokens after the restore", ckpt.tokens_after_restore],
        ["tokens reused from cut prefixes", ckpt.tokens_reused],
        ["tokens regenerated (target 0)", regenerated],
        ["tokens lost to the crash (after the checkpoint)", ckpt.tokens_lost_in_crash],
        ["late call of the old attempt", f"{stale.get('status')} {stale.get('code')}" if stale else "-"],
        ["finished episodes that ran twice", len(set(ckpt.duplicates))],
        ["wall time uninterrupted / checkpointed", f"{base.duration_s:.1f} s / {ckpt.duration_s:.1f} s"],
    ]
    if killed:
        summary[1:1] = [
            [
                "inference worker killed mid-generation",
                f"{killed['name']}, streaming {killed['streaming']} generations",
            ],
            ["generations continued on another worker", _model_sum(live, "failovers")],
            ["episodes run again or failed after the kill", ckpt.reruns_before_checkpoint],
        ]
    return summary


#: one rollout's training tokens: for each model call, its prompt ids, generated ids and their log-probs
TrainingTokens = list[tuple[list[int], list[int], list[float]]]


def training_tokens(row: dict[str, Any] | None) -> TrainingTokens:
    """What the results file carries for a trainer of one result row: every model output item's prompt ids,
    generated ids and their log-probs (the last item of each model response carries them, NeMo Gym's
    ``…__training`` items). A multi-turn row that lists its turns (``all_attempts``, the proof refinement
    agent's) carries each turn's response there, its own ``response`` being the last turn's."""
    result = (row or {}).get("result") or {}
    attempts = result.get("all_attempts")
    if isinstance(attempts, list) and attempts:
        responses = [a.get("response") or {} for a in attempts if isinstance(a, dict)]
    else:
        responses = [result.get("response") or {}]
    return [
        (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"])
        for response in responses
        for item in response.get("output") or []
        if isinstance(item, dict) and "generation_token_ids" in item
    ]


def ledger_tokens(ledger: FrozenRollout | None) -> TrainingTokens:
    """What a trainer reads of one rollout's frozen token ledger: each call's prompt ids, generated ids and
    their log-probs, in the order the calls were stored (none without a ledger)."""
    return [
        (e.prompt_token_ids, e.generation_token_ids, e.generation_log_probs) for e in (ledger.entries if ledger else [])
    ]


#: what :func:`token_difference` says of a rollout whose training tokens are identical
SAME = "the same ids and log-probs"


def token_difference(base: Run, ckpt: Run, rid: str) -> str:
    """Where rollout ``rid``'s training tokens first differ between the runs, in words (for the report)."""
    mine, theirs = training_tokens(ckpt.results.get(rid)), training_tokens(base.results.get(rid))
    for run, name, row in ((ckpt, "checkpointed", mine), (base, "uninterrupted", theirs)):
        ledger = run.ledgers.get(rid)
        if ledger is None or ledger.incomplete:
            return f"the {name} run's token ledger is {'missing' if ledger is None else 'incomplete'}"
        if ledger_tokens(ledger) != row:
            return f"the {name} run's token ledger differs from its result row"
    if len(mine) != len(theirs):
        return f"{len(mine)} model calls (checkpointed) vs {len(theirs)} (uninterrupted)"
    for call, ((prompt, ids, lps), (their_prompt, their_ids, their_lps)) in enumerate(zip(mine, theirs, strict=True)):
        if prompt != their_prompt:
            at = next(
                (i for i, (a, b) in enumerate(zip(prompt, their_prompt, strict=False)) if a != b),
                min(len(prompt), len(their_prompt)),
            )
            return f"call {call}: prompt ids differ from position {at} ({len(prompt)} vs {len(their_prompt)} ids)"
        for at in range(max(len(ids), len(their_ids))):
            mine_at = (ids[at], lps[at]) if at < len(ids) and at < len(lps) else None
            theirs_at = (their_ids[at], their_lps[at]) if at < len(their_ids) and at < len(their_lps) else None
            if mine_at != theirs_at:
                return (
                    f"call {call} token {at}: {_token(mine_at)} (checkpointed) vs {_token(theirs_at)} (uninterrupted)"
                )
        if (ids, lps) != (their_ids, their_lps):
            return f"call {call}: {len(lps)} log-probs for {len(ids)} ids vs {len(their_lps)} for {len(their_ids)}"
    return SAME


def _token(token: tuple[int, float] | None) -> str:
    return "none" if token is None else f"id {token[0]} log-prob {token[1]:.6g}"


def training_tokens_verdict(base: Run, ckpt: Run, ids: list[str]) -> tuple[str, list[str], int | str]:
    """("yes"/"NO (n)"/"-", the rollouts whose training tokens differ, masked rollouts) for ``ids``.

    A rollout's training tokens are identical when its result row carries the token ids and log-probs of
    the uninterrupted run's row, exactly, and in both
    runs its frozen token ledger holds exactly what its row
    carries (what the trainer reads from the ledger is what the results file says) and is complete. A
    rollout is masked (a trainer must not train on it) when its ledger in the checkpointed run is frozen
    ``incomplete``: a model call of it was lost."""
    differing, masked, seen = [], 0, 0
    for rid in ids:
        mine, theirs = training_tokens(ckpt.results.get(rid)), training_tokens(base.results.get(rid))
        frozen, reference = ckpt.ledgers.get(rid), base.ledgers.get(rid)
        if frozen is not None and frozen.incomplete:
            masked += 1
        if mine or theirs or frozen or reference:
            seen += 1
            if token_difference(base, ckpt, rid) != SAME:
                differing.append(rid)
    if not seen:
        return "-", [], "-"
    return ("yes" if not differing else f"NO ({len(differing)})"), differing, masked


def regenerated_tokens(base: Run, ckpt: Run) -> int:
    """Tokens generated more than once in the checkpointed run, other than those lost to the crash.

    Every token of the uninterrupted run is generated at least once in the checkpointed run: before
    the cut (in the checkpoint), or after the restore. Tokens generated after the checkpoint are lost
    with the crash and legitimately generated again after the restore; every other repetition is
    waste: a token the checkpoint should have kept (before the cut and again after the restore), or
    one generated twice by either stack. So with exact counts (each stack's worker total, taken
    once its worker had stopped)

        before + lost + after = uninterrupted + lost + regenerated
        regenerated = before + after - uninterrupted

    and 0 means: every token generated before the checkpoint is in it and is never generated again.
    The tokens lost to the crash cancel out (their second generation is part of ``after``).
    """
    return ckpt.tokens_before_cut + ckpt.tokens_after_restore - base.tokens_generated


def _models(live: dict[str, Any]) -> list[dict[str, Any]]:
    """The live counts of the policy model, or of each of its replicas (policy-model-0, ...)."""
    return [v for k, v in live.items() if k == "policy-model" or k.startswith("policy-model-")]


def _model_sum(live: dict[str, Any], kind: str) -> int | str:
    models = _models(live)
    return sum(int(m.get(kind, 0)) for m in models) if models else "-"


def _model_line(live: dict[str, Any], in_flight: str = "cut") -> str:
    """The policy models' generations in flight (``cut`` by a final checkpoint, or still streaming: ``generations``,
    after a checkpoint the stack resumes from) / held."""
    if not _models(live):
        return "-"
    return f"{_model_sum(live, in_flight)} / {_model_sum(live, 'held')}"


# --- the demo's stories of a stack that checkpoints itself (demo/preemption.py) -----------------------------------


def compare_stories(base: Run, crashed: Run, preempted: Run, agent_env: dict[str, str], every_s: float) -> Verdict:
    """Both stories against the uninterrupted run: every reward and every rollout's training tokens equal, nothing
    twice; after the preemption no token generated twice; after the crash, what was generated again is the work
    since the newest scheduled checkpoint, which the schedule (``every_s``) bounds."""
    problems: list[str] = []
    stories = {"crashed": crashed, "preempted": preempted}
    by_env: dict[str, ByEnv] = {}
    tokens_by_env: dict[str, TokensByEnv] = {}
    for name, run in stories.items():
        found: list[str] = []
        by_env[name] = _rewards_by_env(base, run, agent_env, found)
        tokens_by_env[name] = {env: training_tokens_verdict(base, run, s["ids"]) for env, s in by_env[name].items()}
        found += _token_problems(base, run, tokens_by_env[name]) + _restore_problems(run)
        problems += [f"{name}: {problem}" for problem in found]
    regenerated = regenerated_tokens(base, preempted)
    if regenerated != 0:
        problems.append(f"preempted: {regenerated} tokens generated again after the resume (target 0)")
    crash = crashed.newest
    lost_window = (crashed.crashed_at or 0.0) - (crash.started_at if crash is not None else 0.0)
    lines = [
        "rewards per environment:",
        _stories_table(by_env, tokens_by_env),
        "",
        f"SIGKILL of every process with no warning (the stack checkpoints itself every {every_s:g} s):",
        table(["", "value"], _crash_summary(base, crashed, lost_window)),
        "",
        "preemption: SIGTERM to every server, no checkpoint command:",
        table(["", "value"], _preemption_summary(base, preempted, regenerated)),
    ]
    return Verdict(ok=not problems, problems=problems, text="\n".join(lines))


def _stories_table(by_env: dict[str, ByEnv], tokens_by_env: dict[str, TokensByEnv]) -> str:
    crash, pre = by_env["crashed"], by_env["preempted"]
    rows = [
        [
            env,
            len(s["ids"]),
            _mean(s["base"]),
            _mean(s["ckpt"]),
            _mean(pre[env]["ckpt"]),
            "yes" if not s["diff"] and not pre[env]["diff"] else f"NO ({len(s['diff']) + len(pre[env]['diff'])})",
            _both(tokens_by_env["crashed"][env][0], tokens_by_env["preempted"][env][0]),
            _both(tokens_by_env["crashed"][env][2], tokens_by_env["preempted"][env][2]),
        ]
        for env, s in sorted(crash.items())
    ]
    headers = ["environment", "episodes", "uninterrupted", "crashed", "preempted", "equal"]
    return table([*headers, "training tokens identical (crashed / preempted)", "masked rollouts"], rows)


def _both(first: object, second: object) -> str:
    return str(first) if first == second else f"{first} / {second}"


def _restore_line(run: Run) -> str:
    rs = run.restore
    return f"{rs.pause_s * 1000:.0f} ms, {len(rs.episodes)} episodes as attempt + 1" if rs else "-"


def _stale_line(run: Run) -> str:
    stale = run.stale_call
    return f"{stale.get('status')} {stale.get('code')}" if stale else "-"


def _crash_summary(base: Run, run: Run, lost_window_s: float) -> list[list[Any]]:
    newest = run.newest
    return [
        [
            "newest scheduled checkpoint before the crash",
            f"{newest.checkpoint_id}, pause {(newest.pause_s or 0) * 1000:.0f} ms, {newest.episodes} episodes live"
            if newest
            else "-",
        ],
        ["the crash came after it", f"{lost_window_s:.1f} s"],
        ["resumed automatically", run.resumed_line.split(",")[0].removeprefix("resumed automatically from ") or "-"],
        ["restore into fresh processes", _restore_line(run)],
        ["tokens, uninterrupted run", base.tokens_generated],
        ["tokens the crashed stack generated", run.tokens_before_cut],
        ["tokens after the resume", run.tokens_after_restore],
        ["tokens generated again: the work since that checkpoint", regenerated_tokens(base, run)],
        ["late call of the old attempt", _stale_line(run)],
        ["finished episodes that ran twice", len(set(run.duplicates))],
    ]


def _preemption_summary(base: Run, run: Run, regenerated: int) -> list[list[Any]]:
    termination = run.termination
    final = termination.final if termination is not None else None
    took = termination.signal_to_published_s if termination is not None else None
    return [
        ["signal to published (the final checkpoint)", f"{took * 1000:.0f} ms" if took is not None else "-"],
        [
            "final checkpoint",
            f"{final.checkpoint_id}, {human_bytes(final.bytes)} in {final.records} records" if final else "-",
        ],
        ["episodes live at the signal's checkpoint", final.episodes if final else "-"],
        ["model generations in flight (cut) / held", _model_line(run.in_flight)],
        ["resumed automatically", run.resumed_line.split(",")[0].removeprefix("resumed automatically from ") or "-"],
        ["restore into fresh processes", _restore_line(run)],
        ["tokens before the cut (in the checkpoint)", run.tokens_before_cut],
        ["tokens after the resume", run.tokens_after_restore],
        ["tokens reused from cut prefixes", run.tokens_reused],
        ["tokens regenerated (target 0)", regenerated],
        ["late call of the old attempt", _stale_line(run)],
        ["finished episodes that ran twice", len(set(run.duplicates))],
        ["wall time uninterrupted / preempted", f"{base.duration_s:.1f} s / {run.duration_s:.1f} s"],
    ]
