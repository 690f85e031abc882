"""Typed server configuration, loaded from YAML and then the environment.

Each server's ``Config`` subclasses :class:`ServerConfig`; :func:`load_config` is called by
``gymckpt serve`` (:mod:`gym_services.server.serve`) and the tests.

Environment variables win over the file, so a Kubernetes Secret can inject the
control token and the session secret without writing them into a ConfigMap; they are read with
pydantic-settings (:class:`EnvShortcuts`, :class:`EnvironmentOverlay`):

- ``GYMCKPT_CONTROL_TOKEN``   -> ``checkpoint.control_token``
- ``GYMCKPT_SESSION_SECRET``  -> ``session_secret``
- ``GYMCKPT_PARTICIPANT_ID``  -> ``checkpoint.participant_id``
- ``GYMCKPT_JOB_TOKEN``       -> ``job_token`` (the collection server's)
- ``GYMCKPT__A__B=value``     -> ``a.b``, for any other field (a list or mapping written as YAML, ``null`` for
  none, anything else as the field's type reads it); wins over a shortcut for the same field
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, SettingsError

C = TypeVar("C", bound="ServerConfig")

#: the prefix of ``GYMCKPT__SECTION__FIELD`` (sections and fields separated by ``__``)
ENV_PREFIX = "GYMCKPT__"


class EnvShortcuts(BaseSettings):
    """The deployment secrets' own variables, ``GYMCKPT_<NAME>``, each for one field (:data:`SHORTCUT_FIELDS`).

    An empty variable is not set."""

    model_config = SettingsConfigDict(env_prefix="GYMCKPT_", case_sensitive=False, env_ignore_empty=True)

    control_token: str | None = None
    session_secret: str | None = None
    participant_id: str | None = None
    job_token: str | None = None


#: where each shortcut goes in a server's config
SHORTCUT_FIELDS: dict[str, tuple[str, ...]] = {
    "control_token": ("checkpoint", "control_token"),
    "session_secret": ("session_secret",),
    "participant_id": ("checkpoint", "participant_id"),
    "job_token": ("job_token",),
}


class EnvironmentOverlay(EnvSettingsSource):
    """``GYMCKPT__A__B=value`` for field ``a.b`` of a config class: pydantic-settings' environment source over
    the class's fields, a list or mapping value read as YAML (``[a, b]``, ``{k: v}``), ``null`` read as none."""

    def __init__(self, config: type[BaseModel]) -> None:
        # the source reads only the class's fields (``model_fields``); it validates nothing
        super().__init__(
            cast(Any, config),
            env_prefix=ENV_PREFIX,
            env_nested_delimiter="__",
            case_sensitive=False,
            env_parse_none_str="null",
        )
        self.config_class = config

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        return yaml.safe_load(value)

    def unknown(self) -> list[str]:
        """``GYMCKPT__`` variables naming no field of the config (a typo must not pass unseen)."""
        fields = {name.lower() for name in self.config_class.model_fields}
        out = []
        for name in self.env_vars:  # lower-cased by the source
            if name.startswith(ENV_PREFIX.lower()) and len(name) > len(ENV_PREFIX):
                head = name[len(ENV_PREFIX) :].split("__")[0]
                if head and head not in fields:
                    out.append(name.upper())
        return sorted(out)


class ConfigError(ValueError):
    """A configuration that cannot start a server; the message says which field."""


class StorageConfig(BaseModel):
    """How this server reaches checkpoint storage (the location itself comes with each capture and restore)."""

    model_config = ConfigDict(extra="forbid")

    endpoint_url: str | None = Field(default=None, description="S3 endpoint; AWS_ENDPOINT_URL otherwise")
    region: str | None = Field(default=None, description="S3 region; AWS_REGION/AWS_DEFAULT_REGION otherwise")
    max_concurrency: int = Field(default=16, ge=1, le=256, description="parallel record reads/writes")
    access_key_id: SecretStr | None = Field(default=None, description="S3 key; the AWS credential chain otherwise")
    secret_access_key: SecretStr | None = Field(default=None, description="S3 secret key, with access_key_id")
    gateway_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+/?$",
        description="the storage gateway (the operator's, on Kubernetes) that signs each object of a capture or "
        "restore carrying a grant; a request never names it",
    )


class CheckpointConfig(BaseModel):
    """The control plane's settings."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="mount the control plane; false: not a checkpoint participant")
    control_token: SecretStr | None = Field(
        default=None, description="bearer token of the control routes (GYMCKPT_CONTROL_TOKEN)"
    )
    participant_id: str | None = Field(default=None, description="stable id; the server name when unset")
    lease_check_interval_s: float = Field(
        default=0.2, gt=0, le=10, description="how often a paused server checks its lease"
    )
    poll_interval_s: float = Field(default=0.005, gt=0, le=1, description="prepare's wait-for-boundary poll")
    termination_grace_s: float = Field(
        default=0.0,
        ge=0,
        le=86400,
        description="on SIGTERM, keep serving and holding state this long for a final checkpoint (exit as soon as "
        "its part is persisted); 0: SIGTERM drains and exits at once. On Kubernetes: the pod's "
        "terminationGracePeriodSeconds less a margin (the chart sets it); locally: `gymckpt up --termination-grace`",
    )
    pack_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="checkpoints pack records into objects of about this many bytes",
    )


class ServerConfig(BaseModel):
    """Fields every server has; each server subclasses it with its own."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="server name; the participant id by default")
    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(default=8000, ge=0, le=65535, description="data port")
    session_secret: SecretStr | None = Field(
        default=None, description="signs session cookies, at least 16 characters (GYMCKPT_SESSION_SECRET)"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="structured (JSON) log level"
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="larger request bodies are refused with 413 before they are read (measured on the demo's "
        "traffic: the largest request is 37 KB, a workplace_assistant /verify; indirect_prompt_injection "
        "environments are bounded at 1 MB; a 128k-token conversation is about 1 MB)",
    )
    memory_trim_interval_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="gymckpt serve gives the C allocator's free pages back to the system this often (glibc's "
        "malloc_trim; they otherwise stay resident, counted against the pod's memory limit); 0: never",
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="the control plane")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="how checkpoint storage is reached")

    @property
    def participant_id(self) -> str:
        return self.checkpoint.participant_id or self.name

    def require_secrets(self) -> None:
        """Refuse to start a checkpointing server without its deployment secrets."""
        if not self.checkpoint.enabled:
            return
        missing = []
        if self.checkpoint.control_token is None or not self.checkpoint.control_token.get_secret_value():
            missing.append("checkpoint.control_token (or GYMCKPT_CONTROL_TOKEN)")
        if self.session_secret is None or len(self.session_secret.get_secret_value()) < 16:
            missing.append("session_secret of at least 16 characters (or GYMCKPT_SESSION_SECRET)")
        if missing:
            raise ConfigError(f"server {self.name!r} needs " + " and ".join(missing))


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def env_overrides(config: type[BaseModel]) -> dict[str, Any]:
    """Overrides of ``config`` from the environment: the shortcuts, then every ``GYMCKPT__`` variable (which wins).

    A shortcut whose field the config does not have is left out, so one environment can serve every server of
    a stack; a ``GYMCKPT__`` variable naming no field is an error.
    """
    out: dict[str, Any] = {}
    for name, value in EnvShortcuts().model_dump(exclude_none=True).items():
        path = SHORTCUT_FIELDS[name]
        if path[0] in config.model_fields:
            _set_path(out, path, value)
    overlay = EnvironmentOverlay(config)
    unknown = overlay.unknown()
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: no such field in {config.__name__}")
    try:
        return deep_merge(out, overlay())
    except SettingsError as exc:
        raise ConfigError(f"{exc}: {exc.__cause__}") from None


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> C:
    """Defaults, then the file, then the environment (:func:`env_overrides`), then explicit overrides (e.g.
    ``--port``), validated."""
    data: dict[str, Any] = dict(defaults or {})
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping, got {type(loaded).__name__}")
        data = deep_merge(data, loaded)
    data = deep_merge(data, env_overrides(cls))
    if overrides:
        data = deep_merge(data, overrides)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise ConfigError(f"invalid {cls.__name__}: " + "; ".join(lines)) from None
