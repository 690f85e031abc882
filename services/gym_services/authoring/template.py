"""``gymckpt new-server NAME``: a package with a server that takes part in checkpoints, its README, its tests.

The files come from ``template/`` (``{{name}}``: the package's import name, ``{{dist}}``: its distribution name).
The server is the key-value notebook ``docs/authoring.md`` builds step by step (a test keeps the two equal).
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

#: template file -> where it goes in the new package (``{{name}}`` replaced)
LAYOUT = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "init.py.tmpl": "{{name}}/__init__.py",
    "app.py.tmpl": "{{name}}/app.py",
    "episodes.yaml.tmpl": "episodes.yaml",
    "stack.yaml.tmpl": "stack.yaml",
    "test_app.py.tmpl": "tests/test_app.py",
    "test_checkpoint.py.tmpl": "tests/test_checkpoint.py",
}


class TemplateError(ValueError):
    """A name the template cannot use, or a folder that is already there."""


def render(text: str, name: str) -> str:
    return text.replace("{{name}}", name).replace("{{dist}}", name.replace("_", "-"))


def template_text(template: str) -> str:
    return (files("gym_services.authoring") / "template" / template).read_text()


def new_server(name: str, parent: Path) -> list[Path]:
    """Write the package ``name`` into ``parent/name``; returns the files written."""
    if not NAME_PATTERN.match(name):
        raise TemplateError(f"{name!r} is not a package name: lower-case letters, digits and _, a letter first")
    root = parent / name
    if root.exists():
        raise TemplateError(f"{root} already exists; choose another name or folder")
    written = []
    for template, target in LAYOUT.items():
        path = root / render(target, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(template_text(template), name))
        written.append(path)
    return written
