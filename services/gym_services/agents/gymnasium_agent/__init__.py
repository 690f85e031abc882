"""The gymnasium agent: /reset, then model turn and /step until the environment ends the episode."""
