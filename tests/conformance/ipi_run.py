"""The groups of sequences a conformance run compares (CI and ``benchmarks/conformance_ipi.py``).

Verify bodies are posted as NeMo Gym's agent posts them: the oracle validates each through the
reference's own request models and returns their dump (``canonical_verify``), which both sides then
receive byte for byte. A body the reference refuses is posted as it is.
"""

from __future__ import annotations

import random
from typing import Any

from tests.conformance import ipi_cases as cases
from tests.conformance.ipi_ours import GLUE


#: request keys the reference's dump leaves out (the rollout id alias): posted as given
UNDUMPED = ("_ng_rollout_id", "capture_rollout_id")


def canonical(oracle: Any, body: dict[str, Any]) -> dict[str, Any]:
    dumped = oracle.call(GLUE, "canonical_verify", body)
    if dumped is None:
        return body
    return {**dumped, **{k: body[k] for k in UNDUMPED if k in body}}


def verify_sequences(oracle: Any, seed: int, n: int, as_agents_post: bool = True) -> list[list[dict[str, Any]]]:
    """Seed a task, make a call or two, verify; sometimes verify unseeded, or call again after verify.

    ``as_agents_post=False`` posts the bodies as built (Responses API objects with only some of
    their optional fields), which NeMo Gym re-serialises with every default: a known gap.
    """
    rng = random.Random(seed)
    out = []
    for body in cases.verify_bodies(seed, n):
        env = body.get("environment") or cases.ENVIRONMENTS[body.get("domain", "healthcare")](rng)
        seq = []
        if rng.random() < 0.85:
            seq.append(cases.step("/seed_session", {**body, "environment": env}))
            tool = rng.choice(cases.DOMAIN_TOOLS[body.get("domain", "healthcare")])
            seq.append(cases.step(f"/{tool}", cases.valid_args(tool, env, rng)))
        seq.append(cases.step("/verify", canonical(oracle, body) if as_agents_post else body))
        if rng.random() < 0.2:
            seq.append(cases.step("/get_messages", {}))
        out.append(seq)
    return out


def invalid_verify_sequences(oracle: Any) -> list[list[dict[str, Any]]]:
    """Verify requests the reference refuses (422), fails on (500) or answers from odd fields."""
    rng = random.Random(5)
    return [
        [cases.step("/seed_session", {"environment": cases.healthcare_env(rng)}),
         cases.step("/verify", canonical(oracle, body)), cases.step("/get_messages", {})]
        for body in cases.invalid_verify_bodies()
    ]


def groups(oracle: Any, seed: int, sequences: int, verifies: int) -> dict[str, list[list[dict[str, Any]]]]:
    return {
        "valid call per tool": cases.valid_call_sequences(seed),
        "invalid args/bodies": cases.invalid_sequences(),
        "random sequences": cases.random_sequences(seed, sequences),
        "verify": verify_sequences(oracle, seed, verifies) + invalid_verify_sequences(oracle),
    }
