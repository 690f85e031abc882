"""Test side of the oracle: one long-lived driver process per test session.

``Oracle.call("workplace", "run_sequence", calls)`` runs ``glue_workplace.run_sequence(calls)`` in
the oracle environment against NeMo Gym's unmodified modules and returns its JSON result.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

GLUE_DIR = Path(__file__).resolve().parent


class OracleError(RuntimeError):
    """The glue failed (not the reference function: glue reports those as data)."""


class Oracle:
    def __init__(self, python: Path, reference: Path, timeout_s: float = 120.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PYTHONPATH"] = os.pathsep.join([str(GLUE_DIR), str(reference)])
        env["PYTHONHASHSEED"] = "0"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [str(python), str(GLUE_DIR / "driver.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            env=env,
            cwd=str(reference),
        )

    def call(self, glue: str, function: str, *args: Any, **kwargs: Any) -> Any:
        line = json.dumps({"glue": glue, "call": function, "args": list(args), "kwargs": kwargs})
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
            timer = threading.Timer(self.timeout_s, self._proc.kill)
            timer.start()
            try:
                answer = self._proc.stdout.readline()
            finally:
                timer.cancel()
        if not answer:
            raise OracleError(f"the oracle process ended (exit {self._proc.poll()}) during {glue}.{function}")
        data = json.loads(answer)
        if "error" in data:
            raise OracleError(f"{glue}.{function}: {data['error']}: {data['message']}")
        return data["result"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(timeout=10)
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
