"""Where a Workplace restore's decode time goes, per session, and what decoding in other processes would cost
the serving process instead (targets: restore <= 1 s at 1,000 sessions, <= 3 s at 10,000).

N Workplace sessions after the benchmark's three mutating tool calls each are exported as the participant writes
them (one record per session, plus the shared base), then decoded as a restore decodes them, step by step, in
this process's CPU time (``time.process_time``: a loaded machine stretches the wall clock, not this):

Each step runs with cyclic garbage collection paused, as a restore runs (otherwise each collection walks
every session rebuilt so far, which was ~40% of decoding 10,000 sessions and most of what was once measured here as
"validate").

- parse: ``json.loads`` of the record (the participant's envelope and the session state);
- validate: the codec's pydantic model of the state (``SessionStateModel``);
- build: the rest of ``decode_session``: the session's pandas tables rebuilt from the base and the diff;
- unpickle: loading the tables ``decode_session`` built from a pickle, what a serving process pays for each
  session decoded in another process (a forked child, a pool) and sent back: pandas frames cross processes only
  by being serialized. Pickled plainly, as a pool would; the rebuilt cells are no longer the base's objects, so
  the next checkpoint's diff loses its identity shortcut too.

    .venv/bin/python benchmarks/restore_decode.py [--sessions 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.checkpoint_pause import MUTATIONS  # noqa: E402

from gym_services.control.gc_pause import collection_paused  # noqa: E402
from gym_services.control.participant import Scope  # noqa: E402
from gym_services.resources.common.participant import ExportedParticipant  # noqa: E402
from gym_services.resources.workplace_assistant.codec import decode_session  # noqa: E402
from gym_services.resources.workplace_assistant.codec_models import SessionStateModel  # noqa: E402
from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions  # noqa: E402


def cpu(work) -> tuple[float, object]:
    t0 = time.process_time()
    out = work()
    return time.process_time() - t0, out


def one_round(n: int) -> dict[str, float]:
    source = WorkplaceSessions()
    participant = ExportedParticipant(source)
    for i in range(n):
        source.seed(f"s{i}")
        for name, arguments in MUTATIONS:
            source.call_tool(f"s{i}", name, arguments)
    records = [r for r in participant._export_sync(Scope.of(None)) if r.key.startswith("session-")]
    bases = dict(source._bases)
    with collection_paused():  # as a restore reads and validates (and the unpickle alike)
        parse_s, payloads = cpu(lambda: [json.loads(r.data) for r in records])
        states = [p["state"] for p in payloads]  # type: ignore[attr-defined]
        validate_s, _ = cpu(lambda: [SessionStateModel.model_validate(s) for s in states])
        decode_s, envs = cpu(lambda: [decode_session(s, bases) for s in states])
        own = [
            {key: df for key, df in env._tables.items() if df is not env.base.tables[key]}
            for env in envs  # type: ignore[attr-defined]
        ]
        blobs = [pickle.dumps(tables, protocol=pickle.HIGHEST_PROTOCOL) for tables in own]
        unpickle_s, _ = cpu(lambda: [pickle.loads(b) for b in blobs])
    return {
        "parse": parse_s / n,
        "validate": validate_s / n,
        "build": max(0.0, decode_s - validate_s) / n,
        "unpickle": unpickle_s / n,
        "pickle bytes": statistics.mean(len(b) for b in blobs),
        "tables": statistics.mean(len(t) for t in own),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="sessions per round (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the table gives each step's median (default 3)")
    args = parser.parse_args()
    rounds = [one_round(args.sessions) for _ in range(args.rounds)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(
        f"Workplace restore decode, CPU ms per session (median of {args.rounds} rounds of {args.sessions} sessions; "
        f"{med['tables']:.0f} rebuilt tables per session; load average {os.getloadavg()[0]:.1f})"
    )
    print(f"{'step':>40} {'ms/session':>10} {'1,000 sessions s':>16} {'10,000 sessions s':>17}")
    steps = [
        ("parse (json)", med["parse"]),
        ("validate (pydantic)", med["validate"]),
        ("build (pandas)", med["build"]),
        ("decode in this process: sum", med["parse"] + med["validate"] + med["build"]),
        (f"unpickle the built tables ({med['pickle bytes'] / 1024:.0f} KB)", med["unpickle"]),
    ]
    for name, per in steps:
        print(f"{name:>40} {per * 1e3:>10.3f} {per * 1e3:>16.2f} {per * 1e4:>17.2f}")
    print()
    print(
        "a decode in other processes still leaves the serving process at least the unpickle row per session; "
        "it wins only while unpickle < parse + validate + build"
    )


if __name__ == "__main__":
    main()
