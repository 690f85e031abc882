"""Runs INSIDE the oracle environment: a JSON-lines loop calling functions of glue modules.

Started by :class:`tests.conformance.oracle.client.Oracle`, with the unpacked reference wheel and
this folder on ``sys.path``. Each request line is ``{"glue": NAME, "call": FUNCTION, "args": [...],
"kwargs": {...}}``; the answer line is ``{"result": ...}`` or ``{"error": TYPE, "message": TEXT}``
when the glue itself failed (a reference function's own exception is the glue's to report as data).
Stdout carries only answers: everything the reference prints goes to stderr.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback


def main() -> None:
    answers = sys.stdout
    sys.stdout = sys.stderr  # reference code that prints must not corrupt the protocol
    glues: dict[str, object] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            name = request["glue"]
            if name not in glues:
                glues[name] = importlib.import_module(f"glue_{name}")
            fn = getattr(glues[name], request["call"])
            answer = {"result": fn(*request.get("args", []), **request.get("kwargs", {}))}
            text = json.dumps(answer)
        except Exception as exc:
            text = json.dumps({"error": type(exc).__name__, "message": f"{exc}\n{traceback.format_exc()}"})
        answers.write(text + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
