"""The kinds of inference worker ``gymckpt demo --engine`` runs the policy model on, and what changes with each;
imports nothing, so the CLI's parser can offer the choices without loading the demo's stack. (The policy model's
own wire adapters, one per engine protocol, are ``ENGINES`` in :mod:`gym_services.models.policy_model.engines`.)"""

#: the built-in worker (scripted policies that solve the tasks) or llama.cpp's llama-server serving the tiny generated
#: model (random weights: episodes end by their length and turn limits)
WORKER_KINDS = ("builtin", "llama.cpp")
#: with llama.cpp, every model call generates at most this many tokens (random weights rarely stop on their own)
LLAMA_MAX_OUTPUT_TOKENS = 24
