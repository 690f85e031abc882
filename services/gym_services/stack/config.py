"""The stack config: one YAML naming the servers, their ports and settings.

```yaml
name: demo
state_dir: .gymckpt/demo            # state file, logs, generated configs (relative to the YAML)
storage: embedded-s3                # where checkpoints go: embedded-s3 (a local SeaweedFS that `up` starts),
                                    # s3://bucket/prefix (AWS_* variables set before `up`), or file:///abs/path;
                                    # default: file://<state_dir>
checkpoint: {every: 30s, keep: 5}   # the stack checkpoints itself (stack/schedule.py); on SIGTERM it takes a final
                                    # checkpoint within termination_grace (default 30s) - with or without `every`
servers:                            # (a server the stack does not start: NAME: {external: URL}, stack/external.py)
  policy_model:                     # instance name = participant id
    server: policy_model            # a name `gymckpt serve` knows (`gymckpt servers`), or my_pkg.my_env:create_app
    port: 0                         # 0 = pick a free port
    replicas: 1                     # processes of this server (default 1): see below
    config:                         # the server's own config fields
      upstream: {base_url: "{url:inference_worker}"}   # another server's URL
```

A server with ``replicas: N`` (N > 1) runs as N processes named ``<name>-0`` ... ``<name>-<N-1>``,
each its own participant, like a StatefulSet's ordinal pods. ``{url:NAME}`` of such a server is the
list of its replicas' URLs in ordinal order (a string around it, such as ``"{url:worker}/v1"``,
becomes one string per replica), which is what the agents, the collection and the policy model take
for a replicated server; ``{host:NAME}`` and ``{port:NAME}`` name one process and are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_services.base.config import ConfigError
from gym_services.server.sources import UnknownServer, check
from gym_services.stack.schedule import CheckpointSettings

URL_REF = re.compile(r"\{(url|port|host):([A-Za-z0-9._-]+)\}")


#: servers that hold one job for the whole stack and so run as one process
SINGLE_REPLICA = frozenset({"collection"})
MAX_LOCAL_REPLICAS = 64


class ServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(default=None, description="a name `gymckpt serve` knows, or an import path")
    external: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+/?$",
        description="a server the stack does not start, by its URL (stack/external.py)",
    )
    port: int = Field(default=0, ge=0, le=65535)
    participant: bool = Field(default=True, description="false for backends without a control plane")
    replicas: int = Field(
        default=1, ge=1, le=MAX_LOCAL_REPLICAS, description="processes of this server, each its own participant"
    )
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _started_or_external(self) -> ServerSpec:
        if (self.server is None) == (self.external is None):
            raise ValueError("give `server` (a server the stack starts) or `external` (the URL of one it does not)")
        if self.external is not None and (self.replicas != 1 or self.port or self.config):
            raise ValueError("an external server has no replicas, port or config: the stack does not start it")
        return self

    def instances(self, name: str) -> list[str]:
        """The process names of this server, in ordinal order: ``name`` alone, or ``name-0`` ... ``name-<N-1>``."""
        return [name] if self.replicas == 1 else [f"{name}-{i}" for i in range(self.replicas)]


class StackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    state_dir: str = ".gymckpt/stack"  # relative to the current directory
    storage: str | None = Field(
        default=None,
        pattern=r"^(embedded-s3|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?|file:///\S*)$",
        description="embedded-s3, s3://bucket/prefix or file:///path; default file://<state_dir>",
    )
    checkpoint: CheckpointSettings = Field(
        default_factory=CheckpointSettings, description="the schedule, what it keeps, the termination grace"
    )
    servers: dict[str, ServerSpec]

    def resolved_state_dir(self, base: Path) -> Path:
        path = Path(self.state_dir)
        return path if path.is_absolute() else (base / path).resolve()


def load_stack(path: str | Path) -> tuple[StackConfig, Path]:
    """The stack config and the folder its relative paths are relative to."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read stack config {path}: {exc}") from None
    try:
        stack = StackConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise ConfigError(f"invalid stack config {path}: " + "; ".join(lines)) from None
    for name, spec in stack.servers.items():
        if spec.server is None:  # external
            continue
        try:
            check(spec.server)
        except UnknownServer as exc:
            raise ConfigError(f"stack config {path}, server {name}: {exc}") from None
    check_stack(stack, path)
    return stack, path.parent.resolve()


def check_stack(stack: StackConfig, path: str | Path = "the stack config") -> None:
    """References name servers of the stack; replicas are where they can be."""
    names: dict[str, str] = {}
    for name, spec in stack.servers.items():
        for instance in spec.instances(name):
            if instance in names:
                raise ConfigError(
                    f"{path}: process name {instance} is taken twice (servers {names[instance]} and {name})"
                )
            names[instance] = name
        if spec.replicas > 1:
            if spec.server in SINGLE_REPLICA:
                raise ConfigError(
                    f"{path}: server {name} ({spec.server}) runs one job for the whole stack; it cannot have replicas"
                )
            if spec.port:
                raise ConfigError(
                    f"{path}: server {name} has {spec.replicas} replicas, so its port must be 0 (each picks a free one)"
                )
    for name, spec in stack.servers.items():
        for text in _strings(spec.config):
            refs = URL_REF.findall(text)
            for kind, ref in refs:
                if ref not in stack.servers:
                    raise ConfigError(f"server {name} refers to {{{kind}:{ref}}}, which is not in the stack")
                if kind != "url" and stack.servers[ref].replicas > 1:
                    raise ConfigError(
                        f"server {name} refers to {{{kind}:{ref}}}, but {ref} has {stack.servers[ref].replicas} "
                        f"replicas: only {{url:{ref}}} (the list of their URLs) can name it"
                    )
            replicated = {ref for kind, ref in refs if stack.servers[ref].replicas > 1}
            if len(replicated) > 1:
                raise ConfigError(
                    f"server {name}: {text!r} names two replicated servers {sorted(replicated)}; one per value"
                )


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def substitute_urls(value: Any, urls: dict[str, str | list[str]]) -> Any:
    """Replace ``{url:NAME}``, ``{host:NAME}`` and ``{port:NAME}`` in every string of a config tree.

    A string that is exactly ``{port:NAME}`` becomes an integer; a string naming a server with
    replicas (whose entry in ``urls`` is a list) becomes a list, one string per replica."""
    if isinstance(value, str):
        whole = URL_REF.fullmatch(value)
        if whole and whole.group(1) == "port":
            return int(str(urls[whole.group(2)]).rsplit(":", 1)[1])
        lists = [urls[ref] for _, ref in URL_REF.findall(value) if isinstance(urls[ref], list)]
        if lists:
            return [URL_REF.sub(_filler(urls, replica), value) for replica in lists[0]]
        return URL_REF.sub(_filler(urls), value)
    if isinstance(value, dict):
        return {k: substitute_urls(v, urls) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_urls(v, urls) for v in value]
    return value


def _filler(urls: dict[str, str | list[str]], replica: str = "") -> Callable[[re.Match[str]], str]:
    """The text for one ``{kind:NAME}`` reference; a server with replicas stands for ``replica`` (the caller makes
    one string per replica)."""

    def fill(match: re.Match[str]) -> str:
        target = urls[match.group(2)]
        return replica if isinstance(target, list) else _part(target, match.group(1))

    return fill


def _part(url: str, kind: str) -> str:
    if kind == "url":
        return url
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host if kind == "host" else port
