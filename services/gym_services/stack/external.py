"""Servers a stack does not start: ``external`` servers of the stack YAML, and URLs written into servers' configs.

```yaml
servers:
  counter-env:
    external: http://10.0.0.7:8080      # runs elsewhere; a participant: checked, and checkpointed through its
                                        # control routes (it must be started with the stack's control token)
  judge:
    external: http://10.0.0.8:9000
    participant: false                  # keeps nothing between calls: not checkpointed, only reachable
  agent:
    server: simple_agent
    config: {resources_url: '{url:counter-env}', ...}
```

A checkpoint saves only what participants hold, so a server that keeps sessions but takes no part would have its
episodes restored without them, and their rewards lost with nothing reported (``docs/authoring.md``, "Servers outside
the stack"). ``gymckpt up`` therefore refuses, with the reason and the fix:

- an ``external`` server that does not answer, or answers without control routes unless declared
  ``participant: false``, or whose control routes refuse the stack's control token;
- a URL written into a server's config (not ``{url:NAME}``) that answers as a server outside the stack: a
  participant the stack would not checkpoint, or a non-participant nobody declared as holding nothing.
  (A URL that does not answer is left to the server that uses it.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel

from gym_services.control.protocol import CONTROL_PREFIX

#: a URL written into a config (``{url:NAME}`` references are not)
LITERAL_URL = re.compile(r"https?://[^\s'\"{}]+")


class ExternalServer(BaseModel):
    """A server of the stack that the stack did not start: where it is, and whether it takes part in checkpoints."""

    name: str
    url: str
    participant: bool
    server: str = "external"
    ordinal: int = 0
    replicas: int = 1

    @property
    def group_name(self) -> str:
        return self.name


class OutsideError(RuntimeError):
    """A server outside the stack that the stack refuses to run beside; the message says why and what to do."""


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def literal_urls(configs: Mapping[str, object]) -> dict[str, list[str]]:
    """Every URL origin written into the servers' configs, with the servers that name it; not the ``storage``
    section's (the object store and the storage gateway are no Gym servers)."""
    found: dict[str, list[str]] = {}
    for name, config in configs.items():
        if isinstance(config, dict):
            config = {key: value for key, value in config.items() if key != "storage"}
        for text in _strings(config):
            for url in LITERAL_URL.findall(text):
                found.setdefault(origin(url), []).append(name)
    return {url: sorted(set(names)) for url, names in found.items()}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def probe(url: str, token: str, timeout_s: float = 5.0) -> int | None:
    """The status of the server's control status route with the stack's token; None when it does not answer."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            answer = client.get(f"{origin(url)}{CONTROL_PREFIX}/status", headers={"authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    return answer.status_code


def check_external(name: str, url: str, participant: bool, token: str) -> ExternalServer:
    """``name`` at ``url`` is what the stack YAML says it is, or :class:`OutsideError`."""
    status = probe(url, token)
    if status is None:
        raise OutsideError(f"external server {name} at {url} does not answer; start it first")
    if not participant:
        if status == 200:
            raise OutsideError(
                f"external server {name} at {url} is a checkpoint participant but is declared participant: false; "
                "remove that line so its sessions are checkpointed"
            )
        return ExternalServer(name=name, url=url, participant=False)
    if status == 200:
        return ExternalServer(name=name, url=url, participant=True)
    if status in (401, 403):
        raise OutsideError(
            f"external server {name} at {url} refuses the stack's control token: start it with "
            "GYMCKPT_CONTROL_TOKEN set to the stack's (the control_token in the stack's secrets.json)"
        )
    raise OutsideError(not_a_participant(f"external server {name} at {url}", status))


def not_a_participant(what: str, status: int) -> str:
    return (
        f"{what} is not a checkpoint participant (its control routes, {CONTROL_PREFIX}/status, answer {status}): "
        "a checkpoint would restore its episodes without the sessions it keeps, and their rewards would be lost. "
        'Make it a participant (docs/authoring.md; a NeMo Gym server: "A NeMo Gym server"), or, if it keeps '
        "nothing between calls, declare it in the stack YAML as `NAME: {external: URL, participant: false}`"
    )


def check_literal_urls(configs: Mapping[str, object], declared: Mapping[str, str], token: str) -> None:
    """Every URL written into a config names a declared external server, or does not answer, or
    :class:`OutsideError`. ``declared``: the external servers' URL origins -> names."""
    for url, users in literal_urls(configs).items():
        if url in declared:
            continue
        status = probe(url, token)
        if status is None:
            continue
        where = f"{url} (named in the config of {', '.join(users)})"
        if status in (200, 401, 403):
            raise OutsideError(
                f"{where} is a checkpoint participant outside the stack, which its checkpoints would not include: "
                f"declare it as an external server (`NAME: {{external: {url}}}`) and refer to it as {{url:NAME}}"
            )
        raise OutsideError(not_a_participant(where, status))
