"""The servers shipped in this package: name -> module with ``Config`` and ``create_app(config)``.

Read by :mod:`gym_services.server.sources`, which adds the servers other packages register (an entry point of
the :data:`~gym_services.server.sources.ENTRY_POINT_GROUP` group) and servers named by import path
(``my_pkg.my_env:create_app``); ``gymckpt serve`` imports only the one module it runs (the servers are named here,
not imported, see ``docs/decisions.md``).
"""

SERVERS: dict[str, str] = {
    "math_formal_lean": "gym_services.resources.math_formal_lean.app",
    "lean_sandbox_standin": "gym_services.resources.math_formal_lean.sandbox_standin",
    "blackjack": "gym_services.resources.blackjack.app",
    "counter": "gym_services.resources.counter.app",
    "workplace_assistant": "gym_services.resources.workplace_assistant.app",
    "indirect_prompt_injection": "gym_services.resources.indirect_prompt_injection.app",
    "collection": "gym_services.collection.app",
    "inference_worker": "gym_services.models.inference_worker.app",
    "policy_model": "gym_services.models.policy_model.app",
    "simple_agent": "gym_services.agents.simple_agent.app",
    "proof_refinement_agent": "gym_services.agents.proof_refinement_agent.app",
    "gymnasium_agent": "gym_services.agents.gymnasium_agent.app",
    "llama_cpp_worker": "gym_services.models.llama_cpp.worker",
}
