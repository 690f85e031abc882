"""The model side: the policy model (Responses API, generation cuts, held responses) and the built-in inference
worker."""
