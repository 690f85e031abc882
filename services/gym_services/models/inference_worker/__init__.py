"""The built-in inference worker: OpenAI-compatible streaming chat completions from deterministic policies."""
