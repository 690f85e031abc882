"""Where a server comes from: this package, another installed package, or an import path.

``gymckpt serve SERVER`` and a stack YAML's ``server:`` accept three kinds of name (``docs/authoring.md``):

- a server shipped here (:data:`~gym_services.server.registry.SERVERS`: ``counter``, ``workplace_assistant`` ...);
- a name another installed package registers as an entry point of the :data:`ENTRY_POINT_GROUP` group, in its
  ``pyproject.toml``::

      [project.entry-points."gym_checkpoint.servers"]
      kv_notebook = "kv_notebook.app:create_app"

- an import path, ``my_pkg.my_env:create_app`` (or ``my_pkg.my_env``, a module with ``create_app``), importable
  where the server runs.

Every target is a module with ``create_app(config)`` and its ``Config`` class (a
:class:`~gym_services.base.config.ServerConfig`), or a ``create_app`` callable whose first parameter is annotated
with its config class (else its module's ``Config``). :func:`resolve` names the source without importing the
server; :func:`load` imports it. ``gymckpt servers`` lists what :func:`installed` finds.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gym_services.base.config import ServerConfig
from gym_services.server.registry import SERVERS

#: the entry-point group third-party packages register their servers in
ENTRY_POINT_GROUP = "gym_checkpoint.servers"
#: a server's name (shipped or registered): no dots or colons, so it never reads as an import path
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Origin(enum.StrEnum):
    BUILT_IN = "built-in"
    ENTRY_POINT = "entry point"
    IMPORT_PATH = "import path"


class UnknownServer(LookupError):
    """A server name nothing provides, or an import path that does not lead to a server; the message says which."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown server"


@dataclass(frozen=True)
class ServerSource:
    """One server and where it comes from. ``target``: ``module`` or ``module:attribute``; ``distribution``: the
    installed package that registered an entry point (``name version``)."""

    name: str
    target: str
    origin: Origin
    distribution: str | None = None

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.target.partition(":")[2] or "create_app"

    @property
    def default_name(self) -> str:
        """The server's ``name`` when its config gives none: its own name, or an import path's module."""
        return self.module if self.origin is Origin.IMPORT_PATH else self.name

    def describe(self) -> str:
        if self.origin is Origin.ENTRY_POINT:
            return f"entry point of {self.distribution}"
        return str(self.origin)


@dataclass(frozen=True)
class Skipped:
    """An entry point of the group that is not used, and why (``gymckpt servers`` shows it)."""

    name: str
    target: str
    distribution: str
    reason: str


@dataclass(frozen=True)
class ServerFactory:
    """A loaded server: its config class and the ``create_app`` that builds its ASGI app."""

    source: ServerSource
    config_class: type[ServerConfig]
    create_app: Callable[[Any], Any]


def is_import_path(spec: str) -> bool:
    """``my_pkg.my_env:create_app`` and ``my_pkg.my_env`` are import paths; ``counter`` is a name."""
    return ":" in spec or "." in spec


def _registered() -> tuple[list[ServerSource], list[Skipped]]:
    used: dict[str, ServerSource] = {}
    skipped: list[Skipped] = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
        dist = f"{point.dist.name} {point.dist.version}" if point.dist is not None else "an unknown package"
        reason = None
        if not NAME_PATTERN.match(point.name):
            reason = f"the name must match {NAME_PATTERN.pattern} (no dots or colons)"
        elif point.name in SERVERS:
            reason = "a server shipped with gym-checkpoint has this name"
        elif point.name in used:
            reason = f"{used[point.name].distribution} registers this name too"
        elif not _MODULE_PATH.match(point.module) or (point.attr and not point.attr.isidentifier()):
            reason = f"{point.value!r} is not module or module:attribute"
        if reason is not None:
            skipped.append(Skipped(point.name, point.value, dist, reason))
            continue
        used[point.name] = ServerSource(point.name, point.value, Origin.ENTRY_POINT, dist)
    return list(used.values()), skipped


def installed() -> tuple[list[ServerSource], list[Skipped]]:
    """Every server by name: shipped first, then those installed packages register; and the entry points skipped."""
    shipped = [ServerSource(name, module, Origin.BUILT_IN) for name, module in sorted(SERVERS.items())]
    registered, skipped = _registered()
    return shipped + registered, skipped


def resolve(spec: str) -> ServerSource:
    """The source of ``spec`` (a name or an import path), without importing the server."""
    if spec in SERVERS:
        return ServerSource(spec, SERVERS[spec], Origin.BUILT_IN)
    if is_import_path(spec):
        module, _, attribute = spec.partition(":")
        if not _MODULE_PATH.match(module) or (":" in spec and not attribute.isidentifier()):
            raise UnknownServer(f"{spec!r} is not an import path (module.path or module.path:create_app)")
        return ServerSource(spec, spec, Origin.IMPORT_PATH)
    registered, skipped = _registered()
    for source in registered:
        if source.name == spec:
            return source
    why = next((f" ({s.distribution} registers it, but {s.reason})" for s in skipped if s.name == spec), "")
    known = ", ".join(sorted({*SERVERS, *(s.name for s in registered)}))
    raise UnknownServer(
        f"unknown server {spec!r}{why}; known servers: {known} (`gymckpt servers` lists them), "
        "or name one by import path: my_pkg.my_env:create_app"
    )


def check(spec: str) -> ServerSource:
    """:func:`resolve`, and for an import path that its module can be found (importing its parent packages only)."""
    source = resolve(spec)
    if source.origin is Origin.IMPORT_PATH:
        try:
            found = importlib.util.find_spec(source.module)
        except (ImportError, ValueError) as exc:
            raise UnknownServer(f"server {spec!r}: cannot find module {source.module}: {exc}") from None
        if found is None:
            raise UnknownServer(
                f"server {spec!r}: no module {source.module} where this runs (install its package, or set PYTHONPATH)"
            )
    return source


def load(spec: str) -> ServerFactory:
    """Import the server ``spec`` names: its ``create_app`` and its config class."""
    source = resolve(spec)
    try:
        module = importlib.import_module(source.module)
    except ImportError as exc:
        raise UnknownServer(f"server {spec!r} ({source.describe()}): cannot import {source.module}: {exc}") from None
    create_app = getattr(module, source.attribute, None)
    if not callable(create_app):
        raise UnknownServer(
            f"server {spec!r} ({source.describe()}): {source.module} has no callable {source.attribute}"
        )
    config_class = _config_class(create_app, module)
    if config_class is None:
        raise UnknownServer(
            f"server {spec!r} ({source.describe()}): {source.module}.{source.attribute} takes no ServerConfig: "
            "annotate its parameter (def create_app(config: Config)) or define Config(ServerConfig) in its module"
        )
    return ServerFactory(source, config_class, create_app)


def _config_class(create_app: Callable[..., Any], module: Any) -> type[ServerConfig] | None:
    """The first parameter's annotation when it is a :class:`ServerConfig`, else the module's ``Config``."""
    try:
        hints = typing.get_type_hints(create_app)
        first = next(iter(inspect.signature(create_app).parameters), None)
    except (NameError, TypeError, ValueError):
        hints, first = {}, None
    for candidate in (hints.get(first) if first else None, getattr(module, "Config", None)):
        if isinstance(candidate, type) and issubclass(candidate, ServerConfig):
            return candidate
    return None
