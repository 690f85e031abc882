"""The Lean proof verification server (stateless, replay verify) and the deterministic sandbox stand-in."""
