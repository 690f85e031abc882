"""The proof refinement agent: generate a Lean proof, verify it, feed the errors back, up to a number of attempts."""
