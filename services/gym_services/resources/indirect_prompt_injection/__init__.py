"""The indirect prompt injection resources server (see its README), checkpointed as ``exported``."""
