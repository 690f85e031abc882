"""The stack config: one YAML naming the servers, their ports and settings.

```yaml
name: demo
state_dir: .gymckpt/demo            # state file, logs, generated configs (relative to the YAML)
storage: embedded-s3                # where checkpoints go: embedded-s3 (a local SeaweedFS that `up` starts),
                                    # s3://bucket/prefix (AWS_* variables set before `up`), or file:///abs/path;
                                    # default: file://<state_dir>
servers:
  policy_model:                     # instance name = participant id
    server: policy_model            # a name `gymckpt serve` knows
    port: 0                         # 0 = pick a free port
    config:                         # the server's own config fields
      upstream: {base_url: "{url:inference_worker}"}   # another server's URL
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base.config import ConfigError
from gym_services.server.registry import SERVERS

URL_REF = re.compile(r"\{(url|port|host):([A-Za-z0-9._-]+)\}")


class ServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str
    port: int = Field(default=0, ge=0, le=65535)
    participant: bool = Field(default=True, description="false for backends without a control plane")
    config: dict[str, Any] = Field(default_factory=dict)


class StackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    state_dir: str = ".gymckpt/stack"  # relative to the current directory
    storage: str | None = Field(
        default=None,
        pattern=r"^(embedded-s3|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?|file:///\S*)$",
        description="embedded-s3, s3://bucket/prefix or file:///path; default file://<state_dir>",
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
    unknown = sorted({s.server for s in stack.servers.values()} - set(SERVERS))
    if unknown:
        raise ConfigError(f"stack config {path} names unknown servers {unknown}; known: {sorted(SERVERS)}")
    for name, spec in stack.servers.items():
        for kind, ref in URL_REF.findall(yaml.safe_dump(spec.config)):
            if ref not in stack.servers:
                raise ConfigError(f"server {name} refers to {{{kind}:{ref}}}, which is not in the stack")
    return stack, path.parent.resolve()


def substitute_urls(value: Any, urls: dict[str, str]) -> Any:
    """Replace ``{url:NAME}``, ``{host:NAME}`` and ``{port:NAME}`` in every string of a config tree.

    A string that is exactly ``{port:NAME}`` becomes an integer."""
    if isinstance(value, str):
        whole = URL_REF.fullmatch(value)
        if whole and whole.group(1) == "port":
            return int(urls[whole.group(2)].rsplit(":", 1)[1])
        return URL_REF.sub(lambda m: _part(urls[m.group(2)], m.group(1)), value)
    if isinstance(value, dict):
        return {k: substitute_urls(v, urls) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_urls(v, urls) for v in value]
    return value


def _part(url: str, kind: str) -> str:
    if kind == "url":
        return url
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host if kind == "host" else port

