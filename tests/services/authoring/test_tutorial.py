"""docs/authoring.md is followed as written: a third-party server package built in a temporary folder, installed into
a venv, registered by entry point, checked by the harness, run in a stack by name and by import path, checkpointed,
killed, restored.

Every fenced block whose first line is ``# file: PATH`` is written to PATH (blocks of one file in order); every ``$``
line of a ``bash`` block runs in one shell, and each line under it must appear in what it printed (runs of spaces
count as one). Port 8181 becomes a free one.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.services.authoring.layered import layered_venv
from tests.support.ports import free_port

from gym_services.authoring.template import render, template_text

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
TUTORIAL = ROOT / "docs" / "authoring.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
MARK = "::done::"


def blocks(text: str) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCE.findall(text)]


def files(text: str) -> dict[str, str]:
    written: dict[str, list[str]] = {}
    for _, body in blocks(text):
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            written.setdefault(first[len("# file: ") :].strip(), []).append(rest.rstrip("\n"))
    return {path: "\n\n\n".join(parts) + "\n" for path, parts in written.items()}


def steps(text: str) -> list[tuple[str, list[str]]]:
    """Every ``$`` command of the bash blocks, with the lines expected in its output."""
    found: list[tuple[str, list[str]]] = []
    for lang, body in blocks(text):
        if lang != "bash":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif line.strip() and found:
                found[-1][1].append(line)
    return found


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_tutorial_writes_the_template_server() -> None:
    """What `gymckpt new-server` writes is the server the tutorial builds, file for file."""
    written = files(TUTORIAL.read_text())
    assert written["kv_notebook/kv_notebook/app.py"] == render(template_text("app.py.tmpl"), "kv_notebook")
    assert written["kv_notebook/pyproject.toml"] == render(template_text("pyproject.toml.tmpl"), "kv_notebook")
    assert written["episodes.yaml"] == render(template_text("episodes.yaml.tmpl"), "kv_notebook")


def test_the_tutorial_runs_as_written(tmp_path) -> None:
    port = str(free_port())
    text = TUTORIAL.read_text().replace("8181", port)
    for path, content in files(text).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    bin_dir = layered_venv(tmp_path / "venv")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("GYMCKPT_STATE_DIR", None)
    commands = steps(text)
    stop = "status=$?; echo '" + MARK + "' $status; [ $status = 0 ] || exit 1\n"
    script = "".join(f"{command}\n{stop}" for command, _ in commands)
    try:
        done = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540
        )
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["gymckpt", "down", "--kill"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    outputs = done.stdout.split(MARK)
    assert len(outputs) == len(commands) + 1, f"the script stopped early:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for index, (command, expected) in enumerate(commands):
        status = outputs[index + 1].split("\n", 1)[0].strip()
        printed = outputs[index] if index == 0 else outputs[index].partition("\n")[2]
        assert status == "0", f"`{command}` exited {status}:\n{printed[-2000:]}\n{done.stderr[-2000:]}"
        for line in expected:
            assert squeeze(line) in squeeze(printed), f"`{command}` did not print {line!r}:\n{printed[-2000:]}"
