"""The inference engines ``gymckpt demo`` runs on, and what changes with each; imports nothing, so the CLI's parser
can offer the choices without loading the demo's stack."""

#: the built-in worker (scripted policies that solve the tasks) or llama.cpp's llama-server serving the tiny generated
#: model (random weights: episodes end by their length and turn limits)
ENGINES = ("builtin", "llama.cpp")
#: with llama.cpp, every model call generates at most this many tokens (random weights rarely stop on their own)
LLAMA_MAX_OUTPUT_TOKENS = 24
