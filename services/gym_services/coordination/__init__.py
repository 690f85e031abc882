"""The checkpoint and restore transactions and the typed control client, free of Kubernetes (used by the CLI and the
operator)."""
