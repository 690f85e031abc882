"""`gymckpt new-server NAME` writes a package whose own tests pass."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gym_services.authoring.template import LAYOUT, TemplateError, new_server


def test_new_server_writes_a_package_with_a_readme_and_tests(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gym_services.cli", "new-server", "tide_log", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    root = tmp_path / "tide_log"
    assert {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} == {
        target.replace("{{name}}", "tide_log") for target in LAYOUT.values()
    }
    assert 'tide_log = "tide_log.app:create_app"' in (root / "pyproject.toml").read_text()
    assert "gymckpt check-server tide_log" in (root / "README.md").read_text()
    # its own route tests, in process, with the package on the path (the harness test runs in test_tutorial.py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/test_app.py"],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert "2 passed" in tests.stdout


@pytest.mark.parametrize("name", ["Bad", "1st", "with-dash", "a.b"])
def test_a_name_that_is_no_package_is_refused(tmp_path, name) -> None:
    with pytest.raises(TemplateError, match="is not a package name"):
        new_server(name, tmp_path)


def test_an_existing_folder_is_left_alone(tmp_path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(TemplateError, match="already exists"):
        new_server("taken", tmp_path)
