"""The groups of sequences a conformance run compares (CI and ``benchmarks/conformance_ipi.py``).

Verify bodies are posted as built: Responses API objects with only some of their optional fields
(as a client other than NeMo Gym's agents may post them), which the reference validates and echoes
in its canonical form (every declared field, defaults filled in); the whole answer is compared
byte for byte.
"""

from __future__ import annotations

import random
from typing import Any

from tests.conformance import ipi_cases as cases


def verify_sequences(seed: int, n: int) -> list[list[dict[str, Any]]]:
    """Seed a task, make a call or two, verify; sometimes verify unseeded, or call again after verify."""
    rng = random.Random(seed)
    out = []
    for body in cases.verify_bodies(seed, n):
        env = body.get("environment") or cases.ENVIRONMENTS[body.get("domain", "healthcare")](rng)
        seq = []
        if rng.random() < 0.85:
            seq.append(cases.step("/seed_session", {**body, "environment": env}))
            tool = rng.choice(cases.DOMAIN_TOOLS[body.get("domain", "healthcare")])
            seq.append(cases.step(f"/{tool}", cases.valid_args(tool, env, rng)))
        seq.append(cases.step("/verify", body))
        if rng.random() < 0.2:
            seq.append(cases.step("/get_messages", {}))
        out.append(seq)
    return out


def invalid_verify_sequences() -> list[list[dict[str, Any]]]:
    """Verify requests the reference refuses (422), fails on (500) or answers from odd fields."""
    rng = random.Random(5)
    return [
        [
            cases.step("/seed_session", {"environment": cases.healthcare_env(rng)}),
            cases.step("/verify", body),
            cases.step("/get_messages", {}),
        ]
        for body in cases.invalid_verify_bodies()
    ]


def groups(seed: int, sequences: int, verifies: int) -> dict[str, list[list[dict[str, Any]]]]:
    return {
        "valid call per tool": cases.valid_call_sequences(seed),
        "invalid args/bodies": cases.invalid_sequences(),
        "random sequences": cases.random_sequences(seed, sequences),
        "verify": verify_sequences(seed, verifies) + invalid_verify_sequences(),
    }
