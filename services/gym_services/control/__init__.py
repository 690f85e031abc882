"""The checkpoint control plane every server mounts, and the protocol's vocabulary and wire models
(``docs/protocol.md``)."""
