"""Agent servers: each runs the episode loop (model, tools, verify) with a boundary before every step."""
