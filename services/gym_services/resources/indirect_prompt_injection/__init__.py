"""The indirect prompt injection resources server (REFERENCE B.2), checkpointed as ``exported``."""
