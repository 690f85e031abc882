"""What every layer shares, depending on nothing of ours (``docs/architecture.md``, "Layers")."""
