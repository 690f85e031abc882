"""The inference engines ``gymckpt demo`` runs on, and what changes with each; imports nothing, so the CLI's parser
can offer the choices without loading the demo's stack."""

#: the built-in worker (scripted policies that solve the tasks) or llama.cpp's llama-server serving the tiny generated
#: model (random weights: episodes end by their length and turn limits)
ENGINES = ("builtin", "llama.cpp")
#: with llama.cpp, every model call generates at most this many tokens (random weights rarely stop on their own)
LLAMA_MAX_OUTPUT_TOKENS = 24
#: with llama.cpp, how far a log-prob may be from the uninterrupted run's: its CPU kernels round differently with what
#: else the server computes at once (measured up to 2e-6 on the same ids: benchmarks/llama_cpp_logprobs.py)
LLAMA_LOG_PROB_TOLERANCE = 1e-5
