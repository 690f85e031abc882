"""Deterministic policies of the built-in inference worker, selected by the request's ``model`` name."""

from __future__ import annotations

from gym_services.models.inference_worker.policies.base import Conversation, Policy, Turn
from gym_services.models.inference_worker.policies.blackjack import BlackjackBasic
from gym_services.models.inference_worker.policies.ipi import IpiFollow, IpiSafe
from gym_services.models.inference_worker.policies.lean import LEAN_STANDIN_PASS_MARKER, LeanRefine
from gym_services.models.inference_worker.policies.workplace import WorkplaceOracle

POLICIES: dict[str, Policy] = {
    p.name: p for p in (WorkplaceOracle(), IpiSafe(), IpiFollow(), BlackjackBasic(), LeanRefine())
}

__all__ = ["LEAN_STANDIN_PASS_MARKER", "POLICIES", "Conversation", "Policy", "Turn"]
