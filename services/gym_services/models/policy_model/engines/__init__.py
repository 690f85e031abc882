"""Inference engine adapters behind one interface (:mod:`.base`): the policy model picks one by
``upstream.engine``; everything engine-specific lives in its adapter. The SSE engines share :mod:`.sse`."""

from __future__ import annotations

from gym_services.models.policy_model.engines.base import (
    Connection,
    Delta,
    Engine,
    EngineError,
    EngineProtocolError,
    EngineRequest,
    EngineUnavailable,
    Halt,
)
from gym_services.models.policy_model.engines.llama_cpp import LlamaCppEngine
from gym_services.models.policy_model.engines.sse import SseEngine
from gym_services.models.policy_model.engines.vllm import VllmEngine

#: ``upstream.engine`` -> adapter class; another engine registers its adapter here
ENGINES: dict[str, type[Engine]] = {VllmEngine.name: VllmEngine, LlamaCppEngine.name: LlamaCppEngine}

__all__ = [
    "ENGINES",
    "Connection",
    "Delta",
    "Engine",
    "EngineError",
    "EngineProtocolError",
    "EngineRequest",
    "EngineUnavailable",
    "Halt",
    "LlamaCppEngine",
    "SseEngine",
    "VllmEngine",
]
