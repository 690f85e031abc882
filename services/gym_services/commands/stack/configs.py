"""The server configs a checkpoint saw, and what changed since: ``gymckpt checkpoint`` remembers them in the
stack's state folder, and ``gymckpt restore`` warns when the running stack's configs differ (its episodes
continue under the new ones)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import yaml

from gym_services.stack.launcher import StackState

#: <state dir>/checkpoint-configs/<id>.json: the server configs a checkpoint saw
CONFIGS_SEEN = "checkpoint-configs"
_LOCAL_URL = re.compile(r"http://127\.0\.0\.1:\d+")


def server_configs(state: StackState) -> dict[str, dict[str, object]]:
    """Each participant's config as ``{dotted.key: value}``, without what changes on every `up` (ports, the
    local URLs of other servers, another server's port given as ``{port:NAME}``)."""
    configs: dict[str, dict[str, object]] = {}
    ports = {s.port for s in state.servers}
    for server in state.participants():
        path = Path(state.state_dir) / "configs" / f"{server.name}.yaml"
        try:
            loaded = yaml.safe_load(_LOCAL_URL.sub("http://127.0.0.1:PORT", path.read_text())) or {}
        except (OSError, yaml.YAMLError):
            continue
        flat = _flatten({k: v for k, v in loaded.items() if k not in ("host", "port", "log_level")})
        configs[server.name] = {
            # a port of this stack's servers (another server's, given as {port:NAME}) is new on every `up`
            key: "PORT" if key.endswith("port") and type(value) is int and value in ports else value
            for key, value in flat.items()
        }
    return configs


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """A nested mapping as ``{dotted.key: leaf}`` (an empty mapping is a leaf)."""
    if not (isinstance(value, dict) and value):
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def remember_configs(state: StackState, checkpoint_id: str) -> None:
    """Keep what the stack's server configs were when ``checkpoint_id`` was taken (best effort)."""
    folder = Path(state.state_dir) / CONFIGS_SEEN
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{checkpoint_id}.json").write_text(json.dumps(server_configs(state), indent=1, default=str))


def config_changes(state: StackState, checkpoint_id: str) -> list[str]:
    """How the running stack's server configs differ from those checkpoint ``checkpoint_id`` of this stack saw
    (nothing when it was not taken here)."""
    try:
        then = json.loads((Path(state.state_dir) / CONFIGS_SEEN / f"{checkpoint_id}.json").read_text())
    except (OSError, ValueError):
        return []
    now = server_configs(state)
    changes = []
    for name in sorted(set(then) & set(now)):
        keys = sorted(set(then[name]) | set(now[name]))
        diff = [
            f"{k}: {then[name].get(k, '(unset)')} -> {now[name].get(k, '(unset)')}"
            for k in keys
            if then[name].get(k) != now[name].get(k)
        ]
        if diff:
            changes.append(f"{name} ({'; '.join(diff[:5])}{'; ...' if len(diff) > 5 else ''})")
    return changes
