"""Gym Checkpoint's servers and tools; layers in ``docs/architecture.md`` (base → control → server → servers →
coordination → stack/commands/demo/cli)."""
